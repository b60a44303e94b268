"""``clusterkit watch [RUN...|--all]``: on the login node (in tmux or screen, or from cron with
``--once``), retry the runs whose job ended where its own supervisor could not
(:mod:`clusterkit.schedulers.slurm_watch`). One line per event; ``--json``: one object a line.

Exit codes: 0 the pass (``--once``) or the watch ended normally; 1 SLURM could not be asked or a
retry could not be submitted (``--once``: a later pass tries again; the loop says so and goes on);
2 a run named is not found or cannot be watched; 130 Ctrl-C (never between a retry's submit and its
record: that ends first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

from clusterkit.cli.common import EXIT_FAILURE, RUNS_DIR_HELP
from clusterkit.cli.top import MAX_INTERVAL_S, interval_seconds

DEFAULT_INTERVAL_S = 60.0


def watched_runs(args: argparse.Namespace) -> list:
    """The runs named (each must be a plain SLURM run on this machine), or with --all every run
    not completed or cancelled (read again each pass: runs submitted since are watched too)."""
    from clusterkit import api
    from clusterkit.errors import UsageError
    from clusterkit.schedulers.slurm_watch import worth_watching

    if args.all:
        return [run.record for run in api.list_runs(args.runs_dir) if worth_watching(run.record)]
    records = [api.find_run(job, args.runs_dir).record for job in args.runs]
    for record in records:
        if record.scheduler != "slurm":
            where = "run clusterkit watch on its login node" if record.scheduler == "ssh" else "nothing to watch"
            raise UsageError(f"job {record.job_id} ran with the {record.scheduler} executor: {where}")
        if record.tasks or record.links:
            raise UsageError(f"job {record.job_id} is a job array or chain: clusterkit watch follows single runs")
    return records


def cmd_watch(args: argparse.Namespace, host=None, sleep: Callable[[float], None] = time.sleep) -> int:
    from clusterkit.errors import ExternalError, UsageError
    from clusterkit.schedulers.host import LocalHost
    from clusterkit.schedulers.slurm_watch import watch_pass

    if bool(args.runs) == args.all:
        raise UsageError("give the runs to watch (job ids or run directories), or --all")
    host = host or LocalHost()
    noted: set[tuple[str, str]] = set()  # (run dir, failed job) already said not to be retried
    while True:
        failed = False
        try:
            outcomes = watch_pass(host, watched_runs(args), os.environ)
        except ExternalError as exc:
            print(f"clusterkit: watch: {exc}", file=sys.stderr, flush=True)
            outcomes, failed = [], True
        for outcome in outcomes:
            key = (outcome.event.record.run_dir, outcome.event.job_id)
            if not outcome.retried.new and (outcome.retried.job_id or key in noted):
                continue  # another watcher or the job's supervisor retried it; or said already
            noted.add(key)
            failed |= outcome.retried.why_not == "sbatch refused it"
            print(json.dumps(outcome.to_json()) if args.json else outcome.line, flush=True)
        if args.once:
            return EXIT_FAILURE if failed else 0
        sleep(args.interval)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="on the login node: retry runs whose node failed, that SLURM preempted or whose batch shell was killed",
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="job ids or run directories to watch")
    p.add_argument(
        "--all", action="store_true", help="every run of --runs-dir (or the run index) not completed or cancelled"
    )
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument(
        "--interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between passes (default {DEFAULT_INTERVAL_S:g}, at most {MAX_INTERVAL_S:g})",
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit (from cron)")
    p.add_argument("--json", action="store_true", help="one JSON object per event, one a line (docs/json.md)")
    p.set_defaults(func=cmd_watch)

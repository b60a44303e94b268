"""Commands on runs already submitted: status, ls, logs, cancel, export. Each run is answered by
the adapter its record names (:func:`clusterkit.schedulers.api.open_scheduler`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

from clusterkit.cli.common import (
    DEFAULT_RUNS_DIR,
    RUNS_DIR_HELP,
    code_words,
    print_columns,
    print_json,
    record_json,
    status_json,
    whole_number,
    with_host_keys,
    with_job,
    with_json,
)
from clusterkit.spec.layout import EXPORT_DIR


def _find(args: argparse.Namespace):
    from clusterkit import api

    return api.find_run(args.job, args.runs_dir, args.accept_new_host_key).record


def _none_found(runs_dir: str) -> str:
    from pathlib import Path

    return f"no runs under {runs_dir}" + ("" if Path(runs_dir).is_dir() else " nor in the run index")


def array_results(record, scheduler):
    """A job array's state and each task's row, from one status call for the array and its tasks."""
    from clusterkit.runs.arrays import results, task_record

    tasks = [task_record(record, index) for index in record.tasks]
    status, *found = scheduler.statuses([record, *tasks])
    return status, results(record, tasks, found, scheduler.run_file)


def print_results(record, rows, as_csv: bool = False) -> None:
    """A job array's table: each task's point, state, final loss, samples/s and run dir."""
    from clusterkit.runs.arrays import results_csv

    if as_csv:
        sys.stdout.write(results_csv(rows))
        return
    table = [("TASK", "POINT", "STATE", "FINAL LOSS", "SAMPLES/S", "RUN DIR")]
    for row in rows:
        point = " ".join(f"{key}={value}" for key, value in row.point.items()) or "-"
        state = row.state + (f" (exit {row.exit_code})" if row.exit_code not in (None, 0) else "")
        table.append(
            (
                f"{record.job_id}_{row.index}",
                point,
                state,
                "-" if row.final_loss is None else f"{row.final_loss:.4f}",
                "-" if row.samples_per_s is None else f"{row.samples_per_s:.1f}",
                row.run_dir,
            )
        )
    print_columns(table)
    # Each point's curve carries its TASK as its label (clusterkit.runs.curves).
    print(
        f"curves: clusterkit plot {record.job_id}   (one line per TASK; one point: clusterkit plot {record.job_id}_<index>)"
    )


def _where(record) -> str:
    return f"{record.login['host']}:{record.run_dir}" if record.scheduler == "ssh" else record.run_dir


def adapter(record, args: argparse.Namespace):
    from clusterkit.schedulers.api import login_of, open_scheduler

    return open_scheduler(record.scheduler, login_of(record), args.accept_new_host_key)


def cmd_status(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.errors import UsageError
    from clusterkit.runs.status import restart_lines
    from clusterkit.schedulers.api import statuses

    records = [_find(args)] if args.job else [run.record for run in api.list_runs(args.runs_dir, args.limit)]
    if args.job and records[0].tasks:
        return _array_status(records[0], args)
    if args.csv:
        raise UsageError("--csv is for a job array's results table: give its job id")
    found = statuses(records, args.accept_new_host_key, unreachable_ok=not args.job)
    if args.json:
        # One job: its status alone (a login node's clusterkit answers the SSH adapter with it).
        print(
            json.dumps(
                status_json(found[0])
                if args.job
                else [
                    {"job_id": r.job_id, "name": r.name, "run_dir": _where(r), **status_json(s)}
                    for r, s in zip(records, found)
                ]
            )
        )
        return 0
    if not records:
        print(_none_found(args.runs_dir))
        return 0
    for record, status in zip(records, found):
        line = f"{record.job_id}  {record.name}  {status.state}"
        if status.exit_code is not None:
            line += f"  exit {status.exit_code}"
        if status.reason:
            line += f"  ({status.reason})"
        print(line)
        _print_waiting(status)
        if args.job:
            print(f"  run dir: {_where(record)}")
            print(
                f"  layout:  {record.nodes} nodes x {record.ranks_per_node} ranks, {record.launcher}, {record.scheduler} executor"
            )
            if record.code_from:
                print(f"  code:    {code_words(record)}")
            for line in _components(record):
                print(f"  {line}")
            if status.started or status.submitted:
                print(f"  times:   {time_words(status)}")
        if status.failure:
            print(f"  first failure: {status.failure}")
        if status.straggler:
            print(f"  straggler: {status.straggler['summary']}")
        for line in restart_lines(status.restarts or []):
            print(f"  {line}")
    # Said once, however many runs it applies to: their states came from their run directories.
    for note in dict.fromkeys(status.accounting for status in found if status.accounting):
        print(note, file=sys.stderr)
    return 0


def _components(record) -> list[str]:
    """A heterogeneous job's components, from its plan.json (a run on a login node: not read)."""
    from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
    from clusterkit.spec.layout import LAUNCH_PLAN
    from clusterkit.supervisor.components import described
    from clusterkit.supervisor.plan import PlanError, load_plan

    if record.scheduler == "ssh":
        return []
    try:  # bounded, and no FIFO waited on: the run directory is the job's to write
        text = read_bounded(record.path / LAUNCH_PLAN, CONFIG_LIMIT, "the launch plan").decode()
        return described(load_plan(text))
    except (OSError, InputFileError, PlanError, UnicodeDecodeError):  # not there, or not this version's
        return []


def time_words(status) -> str:
    """An ended SLURM job's times, as its accounting has them (the cluster's local time)."""
    import datetime as dt

    words = [
        f"{name} {when.replace('T', ' ')}"
        for name, when in (("submitted", status.submitted), ("started", status.started), ("ended", status.ended))
        if when
    ]
    if status.elapsed_s is not None:
        words.append(f"ran {dt.timedelta(seconds=status.elapsed_s)}")
    return ", ".join(words)


def _print_waiting(status) -> None:
    """A pending job's (or task's) SLURM reason in words and what to do; flagged if it can never run."""
    if status.explanation:
        print(f"  {'NEVER RUNS' if status.never else 'waiting'}: {status.explanation}")


def _array_status(record, args: argparse.Namespace) -> int:
    """A job array: its state over all tasks, then the results table (or the table alone as CSV, or
    the state with a ``tasks`` list as JSON)."""
    from clusterkit.runs.arrays import results_json

    with adapter(record, args) as scheduler:
        status, rows = array_results(record, scheduler)
    if args.csv:
        print_results(record, rows, as_csv=True)
        return 0
    if args.json:
        print(json.dumps({**status_json(status), "tasks": results_json(rows)}))
        return 0
    print(f"{record.job_id}  {record.name}  {status.state}  ({status.reason})")
    _print_waiting(status)
    print(f"  run dir: {_where(record)}")
    print(
        f"  array:   {len(record.tasks)} tasks of {record.nodes} nodes x {record.ranks_per_node} ranks, "
        f"{record.launcher}, {record.scheduler} executor"
    )
    print_results(record, rows)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    import datetime

    from clusterkit import api

    if args.cluster:
        return _ls_on_login_node(args)
    found = api.list_runs(args.runs_dir, args.limit)
    states = api.statuses(found, unreachable_ok=True)
    if args.json:
        print_json(
            [{"run": record_json(run.record), "status": status_json(status)} for run, status in zip(found, states)]
        )
        return 0
    if not found:
        print(_none_found(args.runs_dir))
        return 0
    rows = [("JOB", "NAME", "STATE", "SUBMITTED", "LAYOUT", "RUN DIR")]
    for run, status in zip(found, states):
        record = run.record
        when = datetime.datetime.fromtimestamp(record.submitted_at).strftime("%Y-%m-%d %H:%M")
        rows.append(
            (
                record.job_id,
                record.name,
                status.state,
                when,
                f"{record.nodes}x{record.ranks_per_node} {record.launcher}",
                _where(record),
            )
        )
    print_columns(rows)
    return 0


def _ls_on_login_node(args: argparse.Namespace) -> int:
    """``ls --cluster``: the runs on the cluster itself, as its own clusterkit lists them."""
    from pathlib import Path

    from clusterkit.errors import UsageError
    from clusterkit.load.loader import load_profile
    from clusterkit.schedulers.api import open_scheduler

    profile, profile_path, _ = load_profile(args.cluster, Path.cwd())
    if profile.login is None:
        raise UsageError(f"{profile_path}: cluster profile {profile.name!r} names no login node (login: {{host: ...}})")
    runs_dir = args.runs_dir if args.runs_dir != DEFAULT_RUNS_DIR else (profile.runs_dir or DEFAULT_RUNS_DIR)
    with open_scheduler("ssh", profile.login, args.accept_new_host_key) as scheduler:
        return scheduler.list_runs(runs_dir, args.limit, args.json)


def cmd_logs(args: argparse.Namespace) -> int:
    from clusterkit.errors import UsageError
    from clusterkit.runs.logs import log_files

    record = _find(args)
    if record.tasks:
        raise UsageError(
            f"job {record.job_id} is an array of {len(record.tasks)} tasks, each with its own logs: "
            f"give one, e.g. clusterkit logs {record.job_id}_{record.tasks[0]}"
        )
    world = record.nodes * record.ranks_per_node
    if args.rank is not None and not 0 <= args.rank < world:
        raise UsageError(f"rank {args.rank} is not in this run ({'rank 0' if world == 1 else f'ranks 0-{world - 1}'})")
    if record.scheduler != "ssh" and not log_files(record, args.rank) and not args.follow:
        print(f"no logs yet in {record.run_dir}", file=sys.stderr)
        return 1
    with adapter(record, args) as scheduler:
        return scheduler.logs(record, args.rank, args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a job that has not ended; one that has is left as it is, and said so."""
    from clusterkit import api

    run = api.find_run(args.job, args.runs_dir, args.accept_new_host_key)
    cancelled = run.cancel()
    if args.json:
        print_json({"job_id": run.job_id, "cancelled": cancelled, "status": status_json(run.status())})
    elif cancelled:
        print(f"cancelled job {run.job_id}")
    else:
        print(f"job {run.job_id} already ended ({run.status().state}): nothing cancelled")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clusterkit.runs.export import export_model

    run_dir = Path(args.run_dir)
    out_dir = Path(args.output) if args.output else run_dir / EXPORT_DIR
    # With --json, stdout is the JSON alone: what the libraries print while loading (DeepSpeed's
    # accelerator notice) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        checkpoint = export_model(run_dir, out_dir, Path(args.checkpoint) if args.checkpoint else None)
    if args.json:
        print_json({"checkpoint": str(checkpoint), "output_dir": str(out_dir)})
    else:
        print(f"exported {checkpoint} to {out_dir}/ (load with from_pretrained({str(out_dir)!r}))")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="state of one job, or of the recent runs")
    with_job(p, required=False)
    p.add_argument("--limit", type=whole_number(1_000_000), default=10, help="how many recent runs (default 10)")
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (a job array: with its results table; shapes: docs/json.md)",
    )
    p.add_argument("--csv", action="store_true", help="a job array's results table as CSV")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ls", help="recent runs with their state")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--limit", type=whole_number(1_000_000), default=20, help="how many recent runs (default 20)")
    p.add_argument("--cluster", metavar="PROFILE", help="list the runs on that cluster's login node instead (over SSH)")
    with_json(p)
    with_host_keys(p)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("logs", help="a job's logs (all nodes, or one rank)")
    with_job(p)
    p.add_argument("--rank", type=int, help="global rank whose own output to show")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a job")
    with_job(p)
    with_json(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser(
        "export", help="a from_pretrained-loadable model from a run's newest checkpoint (ZeRO shards consolidated)"
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--checkpoint", metavar="DIR", help="a specific checkpoint directory (default: the newest)")
    p.add_argument("-o", "--output", metavar="DIR", help=f"default RUN_DIR/{EXPORT_DIR}")
    with_json(p)
    p.set_defaults(func=cmd_export)

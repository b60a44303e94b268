"""``clusterkit top``: a live view of many runs (a sweep's tasks, or the recent runs of the run
index), refreshed every ``--interval`` seconds.

Each refresh asks each scheduler once for all of its runs (:meth:`Scheduler.statuses`: one
``squeue`` for every SLURM job shown), and each adapter is opened once for the whole view (one SSH
connection per login node, kept). A run's files are read where they are: on this machine bounded
(:func:`clusterkit.runs.top.read_run_files`), on a login node by one command per run over that
connection (:func:`remote_run_files`). On a terminal the table fills the screen
(:mod:`clusterkit.cli.top_screen`); otherwise a plain table, or ``--json`` lines, per refresh.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from clusterkit.cli.common import RUNS_DIR_HELP, print_columns, whole_number, with_host_keys
from clusterkit.spec.layout import HANG_RECORD, HEARTBEAT, METRICS

DEFAULT_INTERVAL_S = 5.0
MAX_INTERVAL_S = 3600.0

# A login node's run directory as top reads it, in one command per run: the login node's clock,
# metrics.jsonl's and the heartbeat's "<mtime> <size>" (or -), hang.json's first bytes and
# metrics.jsonl's last bytes in base64 (or -). Only regular files are read (a FIFO would block).
# Every value ($1 the run dir, then the file names and limits) is an argument, never shell text.
_REMOTE_READ = r"""cd -- "$1" || exit 66
date +%s
for f in "$2" "$3"; do [ -f "$f" ] && stat -c '%Y %s' -- "$f" || echo -; done
if [ -f "$4" ]; then head -c "$5" -- "$4" | base64 | tr -d '\n'; echo; elif [ -e "$4" ]; then echo; else echo -; fi
if [ -f "$2" ]; then tail -c "$6" -- "$2" | base64 | tr -d '\n'; echo; else echo -; fi
"""


def interval_seconds(text: str) -> float:
    """An argparse type: seconds between refreshes, more than 0 and at most an hour."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_INTERVAL_S:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds from more than 0 to {MAX_INTERVAL_S:g}")
    return value


def remote_run_files(host, run_dir: str):
    """A run directory on a login node (``host``: its :class:`~clusterkit.schedulers.host.Host`),
    read by one command; what cannot be read reads as absent."""
    from clusterkit.runs.top import HANG_LIMIT, METRICS_TAIL, RunFiles

    argv = ["sh", "-c", _REMOTE_READ, "sh", run_dir, METRICS, HEARTBEAT, HANG_RECORD, str(HANG_LIMIT + 1)]
    done = host.run([*argv, str(METRICS_TAIL)])
    lines = done.stdout.splitlines() if done.returncode == 0 else []
    if len(lines) != 5 or not lines[0].isdigit():
        return RunFiles(b"", None, None, None, time.time())

    def stat(line: str) -> tuple[float | None, int]:
        mtime, _, size = line.partition(" ")
        return (float(mtime), int(size)) if mtime.isdigit() and size.isdigit() else (None, 0)

    def decoded(line: str) -> bytes | None:
        try:
            return None if line == "-" else base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            return b""

    (metrics_mtime, metrics_size), (heartbeat_mtime, _) = stat(lines[1]), stat(lines[2])
    metrics = decoded(lines[4]) or b""
    if metrics_size > len(metrics):  # the first line is cut short
        metrics = metrics[metrics.find(b"\n") + 1 :] if b"\n" in metrics else b""
    return RunFiles(metrics, metrics_mtime, heartbeat_mtime, decoded(lines[3]), float(lines[0]))


Opener = Callable[[Any], AbstractContextManager]  # a record -> its adapter's context (schedulers.api.open_scheduler)


class Watch:
    """The runs shown, with their adapters open for as long as the view lasts."""

    def __init__(self, records: Sequence, names: Sequence[str | None], opener: Opener):
        self.records, self.names = list(records), list(names)
        self._opener = opener
        self._stack = contextlib.ExitStack()
        self._open: dict[str, Any] = {}

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    @staticmethod
    def _key(record) -> str:
        return f"{record.scheduler} {sorted((record.login or {}).items())!r}"

    def _scheduler(self, record):
        key = self._key(record)
        if key not in self._open:
            self._open[key] = self._stack.enter_context(self._opener(record))
        return self._open[key]

    def refresh(self) -> list:
        """Every run's row now: each adapter asked once for the states of all of its runs."""
        from pathlib import Path

        from clusterkit.errors import ExternalError
        from clusterkit.runs.status import UNKNOWN, JobStatus
        from clusterkit.runs.top import RunFiles, read_run_files, row_of

        groups: dict[str, list[int]] = {}
        for index, record in enumerate(self.records):
            groups.setdefault(self._key(record), []).append(index)
        rows: list = [None] * len(self.records)
        for indices in groups.values():
            group = [self.records[i] for i in indices]
            now = time.time()
            try:
                scheduler = self._scheduler(group[0])
                found = scheduler.statuses(group)
                files = []
                for record in group:
                    local = scheduler.run_file(record, METRICS)
                    files.append(
                        read_run_files(local.parent, now)
                        if isinstance(local, Path)
                        else remote_run_files(scheduler.host, record.run_dir)
                    )
            except ExternalError as exc:  # a login node out of reach, a squeue that hangs: its runs UNKNOWN
                found = [JobStatus(UNKNOWN, reason=str(exc))] * len(group)
                files = [RunFiles(b"", None, None, None, now)] * len(group)
            for i, record, status, read in zip(indices, group, found, files):
                rows[i] = row_of(record, status, read, self.names[i])
        return rows

    def keep(self, indices: Sequence[int]) -> None:
        self.records = [self.records[i] for i in indices]
        self.names = [self.names[i] for i in indices]

    def cancel(self, index: int) -> str:
        """Cancel the run unless it has ended; what happened, in words."""
        record = self.records[index]
        scheduler = self._scheduler(record)
        status = scheduler.statuses([record])[0]
        if status.done:
            return f"job {record.job_id} already ended ({status.state}): nothing cancelled"
        scheduler.cancel(record)
        return f"cancelled job {record.job_id}"


def _open_adapter(accept_new_host_key: bool) -> Opener:
    from clusterkit.schedulers.api import login_of, open_scheduler

    return lambda record: open_scheduler(record.scheduler, login_of(record), accept_new_host_key)


def selected_runs(sweep: str | None, runs_dir: str | None, limit: int) -> tuple[list, list[str | None]]:
    """The runs to show and the name each is shown with: a sweep's (job array's) tasks, by job id,
    run directory or name; without one, the run index's newest ``limit`` runs, arrays as their tasks."""
    from clusterkit import api
    from clusterkit.errors import RunNotFound
    from clusterkit.runs.arrays import sweep_points, task_record
    from clusterkit.runs.curves import point_label

    if sweep is None:
        chosen = [run.record for run in api.list_runs(runs_dir, limit)]
    else:
        try:
            chosen = [api.find_run(sweep, runs_dir).record]
        except RunNotFound:
            named = [run.record for run in api.list_runs(runs_dir) if run.record.name == sweep]
            if not named:
                raise RunNotFound(f"no sweep or run {sweep!r} (a job id, run directory or name)") from None
            chosen = [next((r for r in named if r.tasks), named[0])]  # the newest sweep of that name
    records, names = [], []
    for record in chosen:
        if not record.tasks:
            records.append(record)
            names.append(None)
            continue
        points = sweep_points(record, lambda run, name: run.path / name) if record.scheduler != "ssh" else {}
        for index in record.tasks:
            records.append(task_record(record, index))
            names.append(" ".join(filter(None, (record.name, point_label(points.get(index, {}))))))
    return records, names


def _emit(rows: list, as_json: bool) -> None:
    from clusterkit.runs.top import HEADER, cells, row_json

    if as_json:
        for row in rows:
            print(json.dumps(row_json(row)))
    else:
        print_columns([HEADER, *map(cells, rows)])
        print()
    sys.stdout.flush()


def cmd_top(args: argparse.Namespace, opener: Opener | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    records, names = selected_runs(args.sweep, args.runs_dir, args.limit)
    with Watch(records, names, opener or _open_adapter(args.accept_new_host_key)) as watch:
        rows = watch.refresh()
        if args.sweep is None and not args.all:  # the runs still going; those that end while shown stay
            active = [i for i, row in enumerate(rows) if not _ended(row)]
            watch.keep(active)
            rows = [rows[i] for i in active]
        if not rows:
            if not args.json:
                print("no runs going (clusterkit top --all shows the ended ones too)" if records else "no runs found")
            return 0
        if sys.stdout.isatty() and sys.stdin.isatty() and not (args.json or args.once):
            from clusterkit.cli.top_screen import show

            return show(watch, rows, args.interval)
        while True:
            _emit(rows, args.json)
            if args.once or all(map(_ended, rows)):
                return 0
            sleep(args.interval)
            rows = watch.refresh()


def _ended(row) -> bool:
    from clusterkit.runs.status import TERMINAL

    return row.state in TERMINAL


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="a live view of many runs: state, step, samples/s, ETA, last progress, HUNG")
    p.add_argument(
        "sweep",
        nargs="?",
        metavar="SWEEP",
        help="a sweep's (job array's) job id, run directory or name: its tasks (default: the recent runs going)",
    )
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--limit", type=whole_number(1_000_000), default=20, help="how many recent runs (default 20)")
    p.add_argument("--all", action="store_true", help="show the recent runs that ended too")
    p.add_argument(
        "--interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between refreshes (default {DEFAULT_INTERVAL_S:g})",
    )
    p.add_argument("--once", action="store_true", help="print the table once and exit")
    p.add_argument("--json", action="store_true", help="one JSON object per run per refresh, one a line (docs/json.md)")
    with_host_keys(p)
    p.set_defaults(func=cmd_top)

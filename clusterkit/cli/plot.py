"""``clusterkit plot``: loss, learning rate and samples/s against step for one or several runs (a
sweep's id: every point) on one chart: a PNG beside the run(s), and the same chart in the terminal
where there is no display. Each run's metrics.jsonl is read through its scheduler's adapter, so a
run on a login node (``ssh``) is plotted as a local one is."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from clusterkit.cli.common import RUNS_DIR_HELP, print_json, with_host_keys, with_json
from clusterkit.spec.layout import CURVES_PNG, METRICS

if TYPE_CHECKING:
    from pathlib import Path

    from clusterkit.runs.curves import Curves

MAX_NAME_IDS = 100  # characters of job ids in a default file name before it says "and N more"


def _read_curves(run, accept_new_host_key: bool) -> list[Curves]:
    """The run's curves, or a sweep's (array's) tasks', each labelled with its point; one adapter
    (one SSH connection) for the run and its tasks."""
    from clusterkit.runs.arrays import run_metrics, sweep_points, task_record
    from clusterkit.runs.curves import curves_of
    from clusterkit.schedulers.api import login_of, open_scheduler

    record = run.record
    with open_scheduler(record.scheduler, login_of(record), accept_new_host_key) as scheduler:
        if not record.tasks:
            return [curves_of(record.job_id, record.run_dir, run_metrics(record, scheduler.run_file))]
        points = sweep_points(record, scheduler.run_file)
        tasks = [task_record(record, index) for index in record.tasks]
        return [
            curves_of(task.job_id, task.run_dir, run_metrics(task, scheduler.run_file), points.get(index))
            for index, task in zip(record.tasks, tasks)
        ]


def default_output(runs: list) -> Path:
    from pathlib import Path  # here, not at import: --help builds this command's parser and needs no pathlib

    """Beside the run: ``<run dir>/curves.png`` (a sweep: in the array's directory); several runs:
    beside the first, named by their job ids. A run on a login node: here."""
    ids = [run.job_id for run in runs]
    name = (
        "curves-" + "-".join(ids) if len("-".join(ids)) <= MAX_NAME_IDS else f"curves-{ids[0]}-and-{len(ids) - 1}-more"
    )
    if any(run.record.scheduler == "ssh" for run in runs):
        return Path.cwd() / f"{name}.png"
    if len(runs) == 1:
        return Path(runs[0].run_dir) / CURVES_PNG
    return Path(runs[0].run_dir).parent / f"{name}.png"


def has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform in ("darwin", "win32")


def _note(message: str) -> None:
    print(f"clusterkit: {message}", file=sys.stderr)


def _no_metrics(curves: list[Curves]) -> str:
    if len(curves) == 1:
        return f"job {curves[0].job_id} has no metrics yet ({curves[0].run_dir}/{METRICS}): nothing to plot"
    return f"none of jobs {', '.join(c.job_id for c in curves)} has metrics yet: nothing to plot"


def _write_png(drawn: list[Curves], path: Path) -> Path:
    from clusterkit.errors import UsageError
    from clusterkit.runs.charts import write_png

    if path.is_dir():
        path = path / CURVES_PNG
    try:
        write_png(drawn, path)
    except ValueError as exc:  # matplotlib: a suffix it cannot write (-o chart.xyz)
        raise UsageError(f"-o {path}: {exc}") from None
    return path


def cmd_plot(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.errors import MissingPackage
    from clusterkit.runs.charts import EXTRA_HINT, has_matplotlib, terminal_chart
    from clusterkit.runs.curves import curves_json, too_large_note

    runs = list(
        {
            (run.job_id, run.run_dir): run
            for run in (api.find_run(job, args.runs_dir, args.accept_new_host_key) for job in args.job)
        }.values()
    )
    curves = [c for run in runs for c in _read_curves(run, args.accept_new_host_key)]
    for note in filter(None, map(too_large_note, curves)):
        _note(note)
    drawn = [c for c in curves if not c.empty]
    if not drawn:
        _note(_no_metrics(curves))
        return 1
    for left_out in (c for c in curves if c.empty):
        _note(f"job {left_out.job_id} has no metrics yet: left out")
    outputs: list[str] = []
    if has_matplotlib():
        from pathlib import Path

        outputs.append(str(_write_png(drawn, Path(args.output) if args.output else default_output(runs))))
    elif args.output:
        raise MissingPackage(f"-o {args.output}: writing a PNG needs matplotlib: {EXTRA_HINT}")
    else:
        _note(f"no PNG: matplotlib is not installed ({EXTRA_HINT}); drawn in the terminal only")
    if args.json:
        print_json(curves_json(drawn, outputs))
        return 0
    for output in outputs:
        print(f"wrote {output}  ({len(drawn)} run{'s' if len(drawn) > 1 else ''}: {'; '.join(c.label for c in drawn)})")
    if args.terminal or not has_display() or not outputs:
        try:
            from shutil import get_terminal_size  # here: every command's parser imports this module

            print(terminal_chart(drawn, max(40, get_terminal_size((100, 24)).columns), sys.stdout.isatty()))
        except MissingPackage:
            if args.terminal or not outputs:
                raise
            _note(f"no chart in the terminal: plotext is not installed ({EXTRA_HINT})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot", help="loss, learning rate and samples/s against step for runs or a sweep (PNG and terminal)"
    )
    p.add_argument(
        "job",
        nargs="+",
        metavar="RUN",
        help="job id (a sweep's: every point), array task 123_4, or run directory; several: one chart",
    )
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help=f"the PNG (another suffix: that format; default: RUN_DIR/{CURVES_PNG}, several runs: beside the first)",
    )
    p.add_argument(
        "--terminal", action="store_true", help="also draw the chart in the terminal (done anyway without a display)"
    )
    with_json(p)
    with_host_keys(p)
    p.set_defaults(func=cmd_plot)

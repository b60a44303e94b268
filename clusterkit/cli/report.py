"""``clusterkit report`` (where a run's or a sweep's allocation went, its throughput and efficiency)
and ``clusterkit diff`` (what differs between two runs). The figures are computed by
clusterkit.diagnose.run_report and run_diff from what clusterkit.diagnose.run_facts gathered; this
module only finds the runs, gathers and prints."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
from typing import Any

from clusterkit.cli.common import print_columns, print_json, with_job, with_json

CODE_FILES_LIMIT = 10_000  # a code snapshot compared file by file: at most this many files
CODE_FILE_BYTES = 16 << 20  # and files of at most this size (a larger one is compared by size)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _figure_text(figure) -> str:
    if figure.value is None:
        return f"n/a ({figure.why})"
    if figure.unit == "s":
        text = _duration(figure.value)
    elif figure.unit == "%":
        text = f"{figure.value:.1f}%" if abs(figure.value) >= 1 else f"{figure.value:.2g}%"
    elif figure.unit in ("GPU-h", "CPU-h"):
        text = f"{figure.value:,.2f} {figure.unit}"
    else:
        text = f"{figure.value:,.1f} {figure.unit}"
    return f"{text}   [{figure.source}{'; ' + figure.why if figure.why else ''}]"


FIGURES = (
    ("queue_wait", "queue wait"),
    ("wall", "wall time"),
    ("gpu_hours", "GPU-hours"),
    ("cpu_hours", "CPU-hours"),
    ("samples_per_s", "samples/s"),
    ("tokens_per_s", "tokens/s"),
    ("mfu", "MFU"),
    ("scaling_efficiency", "bench scaling"),
    ("vs_bench", "vs bench"),
)


def report_json(report) -> dict[str, Any]:
    """A run's report as --json prints it (docs/json.md: "report")."""
    return {
        "job_id": report.job_id,
        "name": report.name,
        "scheduler": report.scheduler,
        "source": report.source,
        "note": report.note,
        "figures": {name: dataclasses.asdict(getattr(report, name)) for name, _ in FIGURES},
        "shares": [{**dataclasses.asdict(share), "source": report.shares_source} for share in report.shares],
        "jobs": [{**dataclasses.asdict(job), "elapsed_s": job.elapsed_s} for job in report.jobs],
        "problems": report.problems,
    }


def _print_report(report, indent: str = "") -> None:
    from clusterkit.diagnose.run_time import BUCKET_WORDS

    print(f"{indent}job {report.job_id}  {report.name}  ({report.scheduler} executor; figures from {report.source})")
    if report.note:
        print(f"{indent}  note: {report.note}")
    width = max(len(words) for _, words in FIGURES)
    for name, words in FIGURES:
        print(f"{indent}  {words:<{width}}  {_figure_text(getattr(report, name))}")
    total = sum(share.seconds for share in report.shares)
    if total > 0:
        print(f"{indent}  where the allocation went [{report.shares_source}]:")
        rows = [("", "TIME", "SHARE", "GPU-H", "CPU-H")]
        for share in report.shares:
            if share.seconds <= 0:
                continue
            rows.append(
                (
                    BUCKET_WORDS[share.bucket],
                    _duration(share.seconds),
                    f"{100 * share.seconds / total:.1f}%",
                    f"{share.gpu_hours:,.2f}",
                    f"{share.cpu_hours:,.2f}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print(f"{indent}    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for job in report.jobs:
        wait = "" if job.queue_wait_s is None else f", waited {_duration(job.queue_wait_s)}"
        print(
            f"{indent}  job {job.job_id} {job.state or '(local)'}: {_duration(job.elapsed_s)} on "
            f"{job.gpus} GPUs, {job.cpus} CPUs{wait}"
        )
    for problem in report.problems.values():
        if problem not in (report.note or ""):
            print(f"{indent}  ({problem})")


CSV_COLUMNS = ("queue_wait", "wall", "gpu_hours", "cpu_hours", "samples_per_s", "tokens_per_s", "mfu")


def _csv_row(report, point: dict[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"job_id": report.job_id, **(point or {})}
    for name in CSV_COLUMNS:
        row[name] = getattr(report, name).value
    for share in report.shares:
        row[f"{share.bucket}_s"] = round(share.seconds, 3)
    return row


def _write_csv(rows: list[dict[str, Any]]) -> None:
    names = list(dict.fromkeys(key for row in rows for key in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    sys.stdout.write(out.getvalue())


def _adapter(record, args: argparse.Namespace):
    from clusterkit.schedulers.api import login_of, open_scheduler

    return open_scheduler(record.scheduler, login_of(record), args.accept_new_host_key)


def _facts(record, scheduler):
    from clusterkit.diagnose.run_facts import gather

    host = getattr(scheduler, "host", None) if record.scheduler in ("slurm", "ssh") else None
    return gather(record, scheduler.run_file, host)


def cmd_report(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.diagnose.run_report import run_report, sweep_report
    from clusterkit.errors import UsageError
    from clusterkit.runs.arrays import sweep_points, task_record

    if args.json and args.csv:
        raise UsageError("give --json or --csv, not both")
    record = api.find_run(args.job, args.runs_dir, args.accept_new_host_key).record
    with _adapter(record, args) as scheduler:
        if not record.tasks:
            report = run_report(_facts(record, scheduler))
            if args.json:
                print_json(report_json(report))
            elif args.csv:
                _write_csv([_csv_row(report)])
            else:
                _print_report(report)
            return 0
        points = sweep_points(record, scheduler.run_file)
        rows = [
            (index, points.get(index, {}), run_report(_facts(task_record(record, index), scheduler)))
            for index in record.tasks
        ]
    sweep = sweep_report(record, rows)
    if args.json:
        print_json(
            {
                "job_id": sweep.job_id,
                "name": sweep.name,
                "points": [{"index": i, "point": p, **report_json(r)} for i, p, r in sweep.points],
                "totals": {
                    "gpu_hours": dataclasses.asdict(sweep.gpu_hours),
                    "cpu_hours": dataclasses.asdict(sweep.cpu_hours),
                    "shares": [dataclasses.asdict(share) for share in sweep.shares],
                },
            }
        )
    elif args.csv:
        _write_csv([{"index": i, **_csv_row(r, p)} for i, p, r in sweep.points])
    else:
        _print_sweep(sweep)
    return 0


def _print_sweep(sweep) -> None:
    print(f"sweep {sweep.job_id}  {sweep.name}: {len(sweep.points)} points")
    table = [("TASK", "POINT", "WALL", "GPU-H", "CPU-H", "TRAINING", "LOST", "SAMPLES/S", "MFU")]
    for _, point, report in sweep.points:
        shares = {share.bucket: share.seconds for share in report.shares}
        lost = sum(shares.get(bucket, 0.0) for bucket in ("requeues", "retries", "restarts", "hangs"))

        def value(figure, pattern: str) -> str:
            return "n/a" if figure.value is None else pattern.format(figure.value)

        table.append(
            (
                report.job_id,
                " ".join(f"{key}={v}" for key, v in point.items()) or "-",
                _duration(report.wall.value),
                value(report.gpu_hours, "{:,.2f}"),
                value(report.cpu_hours, "{:,.2f}"),
                _duration(shares["training"]) if shares else "n/a",
                _duration(lost) if shares else "n/a",
                value(report.samples_per_s, "{:,.1f}"),
                value(report.mfu, "{:.1f}%"),
            )
        )
    print_columns(table)
    print(f"total: {_figure_text(sweep.gpu_hours)}; {_figure_text(sweep.cpu_hours)}")
    for _, _, report in sweep.points:
        if report.note:
            print(f"  {report.job_id}: {report.note}")


def _hosts(record, scheduler) -> list[str]:
    from clusterkit.diagnose.run_facts import read_text
    from clusterkit.spec.layout import HOSTFILE

    text = read_text(scheduler.run_file, record, HOSTFILE, 1 << 20, {}) or ""
    return [line.split()[0] for line in text.splitlines() if line.split()]


def _code_files(record) -> dict[str, str] | None:
    """The code snapshot's files (relative path -> digest), where it is a folder here."""
    import hashlib
    import os

    from clusterkit.spec.bounded_read import InputFileError, read_bounded
    from clusterkit.spec.layout import SNAPSHOT_DIR

    if record.scheduler == "ssh":
        return None
    root = record.path / SNAPSHOT_DIR
    if not root.is_dir():
        return None
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):  # links are not followed
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            if len(found) >= CODE_FILES_LIMIT:
                return found
            try:
                digest = hashlib.sha256(read_bounded(path, CODE_FILE_BYTES, "a code file")).hexdigest()
            except InputFileError as exc:  # a link, a FIFO or a large file: by what it is
                digest = exc.problem
            except OSError as exc:
                digest = f"unreadable: {exc.strerror}"
            found[os.path.relpath(path, root)] = digest
    return found


def cmd_diff(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.diagnose.run_diff import run_diff
    from clusterkit.diagnose.run_report import run_report
    from clusterkit.errors import UsageError

    records = [api.find_run(job, args.runs_dir, args.accept_new_host_key).record for job in (args.job, args.job_b)]
    for record in records:
        if record.tasks:
            raise UsageError(f"job {record.job_id} is a sweep: give two of its points, e.g. {record.job_id}_0")
    facts, hosts = [], []
    for record in records:
        with _adapter(record, args) as scheduler:
            facts.append(_facts(record, scheduler))
            hosts.append(_hosts(record, scheduler))
    codes = [_code_files(record) for record in records]
    diff = run_diff(
        facts[0],
        facts[1],
        (run_report(facts[0]), run_report(facts[1])),
        (hosts[0], hosts[1]),
        (codes[0], codes[1]) if codes[0] is not None and codes[1] is not None else None,
    )
    if args.json:
        print_json(
            {
                "a": diff.a,
                "b": diff.b,
                "groups": {name: [dataclasses.asdict(d) for d in rows] for name, rows in diff.groups.items()},
            }
        )
        return 0
    print(f"A: {diff.a}\nB: {diff.b}")
    if not diff.groups:
        print("no differences")
    for name, rows in diff.groups.items():
        print(f"{name}:")
        print_columns([("", "A", "B"), *((f"  {d.key}", _shown(d.a), _shown(d.b)) for d in rows)])
    return 0


def _shown(value: Any) -> str:
    """One line: a value's text with its line breaks and control characters escaped."""
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="where a run's (or a sweep's) GPU-hours went: queue, start-up, training, checkpoints, "
        "time lost; throughput and MFU",
    )
    with_job(p)
    with_json(p)
    p.add_argument("--csv", action="store_true", help="one CSV row (a sweep: one per point)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("diff", help="what differs between two runs: recipe, profile, env, code, nodes, outcome")
    with_job(p)
    p.add_argument("job_b", metavar="JOB_B", help="the other run: job id or run directory")
    with_json(p)
    p.set_defaults(func=cmd_diff)

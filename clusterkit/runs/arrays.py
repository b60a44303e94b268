"""A job array's tasks and results: each task is a run of its own (``<array run dir>/<index>/``, job
id ``<array id>_<index>``); a sweep's table lists each point's values, state, final loss and samples/s."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Callable
from typing import Any

from clusterkit.runs.logs import METRICS_LIMIT, Readable, read_run_file
from clusterkit.runs.record import RunRecord, metric_records
from clusterkit.runs.status import COMPLETED, FAILED, PENDING, RUNNING, TERMINAL, JobStatus
from clusterkit.spec.arrays import task_job_id
from clusterkit.spec.bounded_read import InputFileError
from clusterkit.spec.layout import METRICS, SWEEP_POINTS


def task_record(array: RunRecord, index: int) -> RunRecord:
    """Task ``index`` of ``array`` as the array's record says it (a sweep point's own overrides are
    in the task's run.json, which :func:`clusterkit.runs.record.find_run` reads where it can)."""
    return dataclasses.replace(
        array, job_id=task_job_id(array.job_id, index), run_dir=f"{array.run_dir}/{index}", tasks=()
    )


def array_status(tasks: list[JobStatus]) -> JobStatus:
    """One state for the whole array: running while any task is not done, then COMPLETED only if
    every task completed."""
    states = [task.state for task in tasks]
    counts = ", ".join(f"{states.count(state)} {state}" for state in sorted(set(states)))
    if not all(state in TERMINAL for state in states):
        # The first waiting task's reason in words (its siblings wait for the same, or for a throttle).
        why = next((task for task in tasks if task.explanation), None)
        return JobStatus(
            RUNNING if any(state != PENDING for state in states) else PENDING,
            reason=counts,
            explanation=why and why.explanation,
            never=bool(why and why.never),
        )
    return JobStatus(COMPLETED if all(state == COMPLETED for state in states) else FAILED, reason=counts)


def chain_status(links: list[JobStatus], run: JobStatus) -> JobStatus:
    """A chain: the link that runs (or waits) while one does, then how the run itself ended
    (``run``: its exit code, explained), which is the last link's."""
    waiting = [number for number, link in enumerate(links, 1) if link.state in (PENDING, RUNNING)]
    running = [number for number, link in enumerate(links, 1) if link.state == RUNNING]
    if waiting:
        link = links[(running or waiting)[0] - 1]
        return JobStatus(
            RUNNING if running else PENDING,
            reason=f"link {(running or waiting)[0]} of {len(links)}",
            explanation=link.explanation,
            never=link.never,
        )
    return run


@dataclasses.dataclass(frozen=True)
class TaskResult:
    index: int
    point: dict[str, Any]  # a sweep point's values ({} for a plain array)
    state: str
    exit_code: int | None
    final_loss: float | None
    samples_per_s: float | None
    run_dir: str


def _read(file: Readable) -> bytes:
    try:
        return read_run_file(file, METRICS_LIMIT, "a run file")
    except (OSError, InputFileError):
        return b""


RunFile = Callable[[RunRecord, str], Readable]  # a run's file wherever it lives (the adapter's run_file)


def sweep_points(array: RunRecord, run_file: RunFile) -> dict[int, dict[str, Any]]:
    """Each task's sweep point (index -> values); a plain array, or an unreadable file: none."""
    try:
        return {
            p["index"]: p["values"] for p in json.loads(_read(run_file(array, SWEEP_POINTS)) or b"{}").get("points", [])
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def run_metrics(run: RunRecord, run_file: RunFile) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records (none yet, or unreadable: [])."""
    return metric_records(_read(run_file(run, METRICS)).decode("utf-8", "replace"))


def results(array: RunRecord, tasks: list[RunRecord], statuses: list[JobStatus], run_file: RunFile) -> list[TaskResult]:
    """Each task's row; ``run_file`` reads a run's file wherever it lives (the adapter's)."""
    points = sweep_points(array, run_file)
    rows = []
    for index, task, status in zip(array.tasks, tasks, statuses):
        logs = [m for m in run_metrics(task, run_file) if m.get("event") == "log"]
        losses = [m["loss"] for m in logs if isinstance(m.get("loss"), (int, float))]
        speeds = [m["samples_per_s"] for m in logs if isinstance(m.get("samples_per_s"), (int, float))]
        rows.append(
            TaskResult(
                index,
                points.get(index, {}),
                status.state,
                status.exit_code,
                losses[-1] if losses else None,
                speeds[-1] if speeds else None,
                task.run_dir,
            )
        )
    return rows


def _flat(row: TaskResult) -> dict[str, Any]:
    return {
        "index": row.index,
        **row.point,
        "state": row.state,
        "exit_code": row.exit_code,
        "final_loss": row.final_loss,
        "samples_per_s": row.samples_per_s,
        "run_dir": row.run_dir,
    }


def results_csv(rows: list[TaskResult]) -> str:
    """One line per task: index, the point's keys, state, exit code, final loss, samples/s, run dir."""
    out = io.StringIO()
    flat = [_flat(row) for row in rows]
    writer = csv.DictWriter(
        out, fieldnames=list(dict.fromkeys(key for row in flat for key in row)), lineterminator="\n"
    )
    writer.writeheader()
    writer.writerows(flat)
    return out.getvalue()


def results_json(rows: list[TaskResult]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(row) for row in rows]

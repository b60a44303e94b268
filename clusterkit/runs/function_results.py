"""A function job's outcome and value (clusterkit.submit_function): submitit's result pickles,
``<job id>_<task>_result.pkl`` in the run directory, ``("success", value)`` or ``("error", traceback)``.

A pickle runs code as it is read, so a result is unpickled only from a run directory that is ours
and that no one else can write, from a regular file of ours no one else can write (:func:`private`).
Whether a job succeeded is read without unpickling (runs.function_outcomes).
"""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path
from typing import Any

from clusterkit.errors import ExternalError, FunctionFailed, UsageError, UserError
from clusterkit.runs.function_outcomes import ERROR, SUCCESS, log_file, outcomes, result_file, task_count
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import COMPLETED, FAILED, RUNNING, JobStatus
from clusterkit.spec.bounded_read import MiB, read_bounded
from clusterkit.spec.function_jobs import RECORD_LAUNCHER

RESULT_LIMIT = 4096 * MiB  # submitit's own limit on what it pickles is 1 GB by default
LOG_TAIL_LINES = 40


class NotOurs(UserError):
    """A result file or run directory that someone else could have written: never unpickled (nor a
    function submitted from a folder someone else could write)."""


def private(path: Path, directory: bool) -> None:
    """Refuse (:class:`NotOurs`) a path that is a link, not of its kind, not ours, or writable by others."""
    info = os.lstat(path)
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    what = "folder" if directory else "result file"
    if not kind(info.st_mode):
        raise NotOurs(f"{path}: not a {what} (a link or another kind of file): nothing there is unpickled")
    if info.st_uid != os.getuid():
        raise NotOurs(f"{path}: the {what} belongs to uid {info.st_uid}, not to you: nothing there is unpickled")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotOurs(f"{path}: others can write this {what}: nothing there is unpickled")


def log_tail(record: RunRecord, task: int, lines: int = LOG_TAIL_LINES) -> str:
    tails = []
    for stream in ("err", "out"):
        path = log_file(record, task, stream)
        try:
            text = read_bounded(path, 64 * MiB, "a function's log").decode("utf-8", "replace")
        except (OSError, ValueError):
            continue
        tails.append(f"--- {path} (last {lines} lines) ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(tails)


def results(record: RunRecord) -> list[Any]:
    """Each task's return value, in task order; :class:`~clusterkit.errors.FunctionFailed` with the
    remote traceback and the task's log tail where the function raised, or left no result;
    UsageError for a run that is no function's (it has no value)."""
    if record.launcher != RECORD_LAUNCHER:
        raise UsageError(f"job {record.job_id} is not a function's run (launcher {record.launcher}): it has no result")
    private(record.path, directory=True)
    values = []
    for task in range(task_count(record)):
        path = result_file(record, task)
        if not path.exists():
            raise FunctionFailed(
                f"job {record.job_id} task {task} ended without a result ({path})", "", log_tail(record, task)
            )
        private(path, directory=False)
        try:
            state, value = pickle.loads(read_bounded(path, RESULT_LIMIT, "a function's result"))
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError) as exc:
            raise ExternalError(f"{path}: not a submitit result: {exc}") from None
        if state == ERROR:
            value = str(value)
            last = value.strip().splitlines()[-1] if value.strip() else "an exception"
            raise FunctionFailed(
                f"job {record.job_id} task {task}: the function raised {last}", value, log_tail(record, task)
            )
        values.append(value)
    return values


def function_status(record: RunRecord, running: bool) -> JobStatus:
    """A local function job's state: running while its controller runs, then its result files' outcome."""
    if running:
        return JobStatus(RUNNING)
    found = [state for state, _ in outcomes(record)]
    if ERROR in found:
        return JobStatus(FAILED, 1)
    if all(state == SUCCESS for state in found):
        return JobStatus(COMPLETED, 0)
    return JobStatus(FAILED, reason="the function's job ended without a result")

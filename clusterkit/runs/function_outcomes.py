"""A function job's outcome, read from submitit's result pickles without unpickling them: the
pickle's opcodes (pickletools parses, it runs nothing) hold ``"success"`` or ``"error"`` and, for an
error, the remote traceback's text. Status reads this; only the value itself needs unpickling
(runs.function_results, from a private run directory)."""

from __future__ import annotations

import pickletools
from pathlib import Path

from clusterkit.errors import printable
from clusterkit.runs.record import RunRecord
from clusterkit.spec.bounded_read import MiB

SUCCESS, ERROR = "success", "error"
OUTCOME_LIMIT = 1 * MiB  # the outcome, and a traceback, are in the pickle's first bytes
_STRINGS = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE")


def result_file(record: RunRecord, task: int) -> Path:
    return record.path / f"{record.job_id}_{task}_result.pkl"


def log_file(record: RunRecord, task: int, stream: str) -> Path:
    return record.path / f"{record.job_id}_{task}_log.{stream}"


def task_count(record: RunRecord) -> int:
    return record.nodes * record.ranks_per_node


def outcome(path: Path) -> tuple[str | None, str | None]:
    """``(success|error, the traceback for an error)``; ``(None, None)``: no result (yet), or not submitit's."""
    if not path.is_file():  # a FIFO in its place would block the reader: only a regular file is opened
        return None, None
    try:
        with path.open("rb") as handle:
            head = handle.read(OUTCOME_LIMIT)
    except OSError:
        return None, None
    strings = []
    try:
        for opcode, argument, _ in pickletools.genops(head):
            if opcode.name in _STRINGS:
                strings.append(argument)
                if len(strings) == 2:
                    break
    except (ValueError, EOFError):  # cut short, or not a pickle
        pass
    if not strings or strings[0] not in (SUCCESS, ERROR):
        return None, None
    return strings[0], strings[1] if strings[0] == ERROR and len(strings) > 1 else None


def outcomes(record: RunRecord) -> list[tuple[str | None, str | None]]:
    return [outcome(result_file(record, task)) for task in range(task_count(record))]


def function_failure(record: RunRecord) -> str | None:
    """The first task that raised, and the traceback's last line (the exception), as one inert line."""
    for task, (state, traceback) in enumerate(outcomes(record)):
        if state == ERROR:
            last = (traceback or "").strip().splitlines()[-1:] or ["an exception"]
            return printable(f"task {task} raised {last[0]} (Run.result() gives the whole traceback)")
    return None

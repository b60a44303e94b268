"""SLURM job arrays: the index list of an ``--array`` spec (``0-15%4``, ``1,3,5-9:2``), read the way
sbatch reads it, so clusterkit can create every task's run directory before the array starts (SLURM
creates no folders for ``--output``) and list the tasks."""

from __future__ import annotations

import re

# SLURM's own default MaxArraySize is 1001 (indices 0-1000); a site may raise it, clusterkit keeps
# a bound so a typo cannot create a million run directories.
MAX_TASKS = 10_000
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


def array_indices(spec: str) -> list[int]:
    """The task indices, sorted and distinct; ValueError for a range that runs backwards, a zero
    step or a zero throttle, or more than MAX_TASKS tasks."""
    ranges, _, throttle = spec.partition("%")
    if throttle and int(throttle) == 0:
        raise ValueError(f"{spec!r}: the %throttle must be at least 1")
    indices: set[int] = set()
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"{spec!r}: {part!r} is not an index or a range")
        first, last, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
        if last < first or step == 0:
            raise ValueError(f"{spec!r}: {part!r} is an empty range")
        if len(indices) + (last - first) // step + 1 > MAX_TASKS:
            raise ValueError(f"{spec!r}: more than {MAX_TASKS} tasks")
        indices.update(range(first, last + 1, step))
    return sorted(indices)


def array_spec(count: int, max_parallel: int | None) -> str:
    """``0-<count-1>`` with a ``%max_parallel`` throttle where one is given."""
    return f"0-{count - 1}" + (f"%{max_parallel}" if max_parallel else "")


def task_job_id(array_id: str, index: int) -> str:
    """SLURM's name of one array task, which scontrol and scancel take: ``<array id>_<index>``."""
    return f"{array_id}_{index}"

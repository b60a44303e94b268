"""What SLURM's accounting database (``sacct``) says about finished jobs: their final state and exit
code, when they were submitted, started and ended, how long they ran, on which nodes, and what they
were allocated (GPUs, CPUs). The controller forgets a job soon after it ends (MinJobAge); the
database keeps it. A cluster without accounting answers :class:`NoAccounting`, one line, so callers
degrade instead of failing.

``--duplicates``: a requeued job keeps its id, and sacct by default shows only its last instance; the
earlier ones (time a preemption cost) are rows here too, oldest first.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

from clusterkit.errors import SchedulerError
from clusterkit.schedulers.host import Host, without_env

# In this order on every line of ``sacct --parsable2`` (values between "|", none after the last; none
# of these fields can hold a "|": states, ids, times, node lists and TRES lists are single words).
FIELDS = (
    "JobIDRaw",
    "JobID",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "NodeList",
    "AllocTRES",
    "Partition",
)
# sacct takes a format and filters from the environment too; none of them applies here.
_SACCT_ENV = ("SACCT_FORMAT", "SACCT_FEDERATION", "SACCT_LOCAL", "SLURM_TIME_FORMAT")
_GPUS = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")
_CPUS = re.compile(r"(?:^|,)cpu=(\d+)(?:,|$)")


@dataclass(frozen=True)
class JobAccounting:
    """One instance of one job (an array task is a job of its own: ``job_id`` ``7_3``)."""

    job_id: str  # as squeue and the run record name it: "7", "7_3"
    raw_id: str  # SLURM's own number for this job or task
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, REQUEUED, ...
    exit_code: int | None  # the batch shell's; None while running or when killed by a signal
    signal: int  # the signal that ended it, 0 if none
    submitted: dt.datetime | None
    started: dt.datetime | None
    ended: dt.datetime | None
    elapsed_s: int
    nodes: str  # SLURM's node list, e.g. "node[1-2]"; "None assigned" while pending
    gpus: int  # allocated, all nodes together
    cpus: int
    partition: str

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600

    @property
    def cpu_hours(self) -> float:
        return self.cpus * self.elapsed_s / 3600

    @property
    def queue_wait_s(self) -> float | None:
        if self.submitted is None or self.started is None:
            return None
        return max(0.0, (self.started - self.submitted).total_seconds())


@dataclass(frozen=True)
class NoAccounting:
    """This cluster has no accounting (or it did not answer): why, in sacct's own words."""

    why: str

    @property
    def line(self) -> str:
        return f"no SLURM accounting here ({self.why}): final states only while the controller remembers a job"


def sacct_argv(job_ids: Sequence[str]) -> list[str]:
    return without_env(
        _SACCT_ENV,
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--duplicates",
            f"--jobs={','.join(job_ids)}",
            f"--format={','.join(FIELDS)}",
        ],
    )


def job_accounting(host: Host, job_ids: Sequence[str], timeout: float = 30.0) -> list[JobAccounting] | NoAccounting:
    """Every instance of these jobs the database holds, oldest first (an array's tasks: each a row).
    No sacct on the host, or no answer in time, is no accounting too: callers only add what it says."""
    if not job_ids:
        return []
    try:
        done = host.run(sacct_argv(sorted(set(job_ids))), timeout=timeout)
    except SchedulerError as exc:
        return NoAccounting(str(exc))
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return NoAccounting(said[-1].strip() if said else f"sacct exited {done.returncode}")
    return read_sacct(done.stdout)


def read_sacct(output: str) -> list[JobAccounting]:
    """``sacct --parsable2`` lines in :data:`FIELDS`' order; a line of another shape is not a job's."""
    rows = []
    for line in output.splitlines():
        values = line.split("|")
        if len(values) != len(FIELDS) or not values[0].isdigit():
            continue
        field = dict(zip(FIELDS, values))
        exit_code, _, signal = field["ExitCode"].partition(":")
        state = field["State"].split(" ")[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
        rows.append(
            JobAccounting(
                job_id=field["JobID"],
                raw_id=field["JobIDRaw"],
                state=state,
                exit_code=int(exit_code) if exit_code.isdigit() and signal in ("", "0") else None,
                signal=int(signal) if signal.isdigit() else 0,
                submitted=_time(field["Submit"]),
                started=_time(field["Start"]),
                ended=_time(field["End"]),
                elapsed_s=int(field["ElapsedRaw"]) if field["ElapsedRaw"].isdigit() else 0,
                nodes=field["NodeList"],
                gpus=_count(_GPUS, field["AllocTRES"]),
                cpus=_count(_CPUS, field["AllocTRES"]),
                partition=field["Partition"],
            )
        )
    return rows


def _count(pattern: re.Pattern[str], tres: str) -> int:
    found = pattern.search(tres)
    return int(found.group(1)) if found else 0


def _time(text: str) -> dt.datetime | None:
    """sacct's times are the cluster's local time, ISO without a zone ("Unknown", "None" when unset)."""
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None

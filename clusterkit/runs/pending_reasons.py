"""Why SLURM keeps a job pending, for a person: SLURM's reason word -> what it means and what to do,
and whether the job can never start as it is (it waits forever: cancel it and submit it changed).

One table, data only; ``status`` reads it for a pending job (``runs.status.slurm_status``). A
reason not here is shown as SLURM says it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PendingReason:
    meaning: str
    what_to_do: str
    never: bool = False  # as submitted, the job cannot start however long it waits

    def line(self) -> str:
        return f"{self.meaning}{'; it can never run as it is' if self.never else ''}: {self.what_to_do}"


_LIMIT = "another of your (or your account's) jobs must end first, or ask your admins for a larger limit"
_JOB_LIMIT = "the job alone is over a limit of its QOS or account"
_RESUBMIT = "cancel it (clusterkit cancel JOB) and submit it with"

PENDING_REASONS: dict[str, PendingReason] = {
    "Priority": PendingReason(
        "jobs of higher priority are ahead of it in the queue",
        "wait; fewer nodes or a shorter time may backfill sooner",
    ),
    "Resources": PendingReason(
        "it is next, waiting for enough nodes/GPUs to be free", "wait (clusterkit gpus shows what is free now)"
    ),
    "Dependency": PendingReason("it waits for the jobs it depends on (--after) to end", "wait"),
    "DependencyNeverSatisfied": PendingReason(
        "a job it depends on ended in a way its --after type excludes",
        f"{_RESUBMIT} another --after (or --after-type afterany)",
        never=True,
    ),
    "BeginTime": PendingReason("its start time (--begin) has not come yet", "wait"),
    "JobHeldUser": PendingReason("held by its owner", "scontrol release JOB"),
    "JobHeldAdmin": PendingReason("held by an administrator", "ask your admins to release it"),
    "PartitionTimeLimit": PendingReason(
        "its time is over the partition's limit", f"{_RESUBMIT} a lower resources.time", never=True
    ),
    "PartitionNodeLimit": PendingReason(
        "its node count is outside the partition's limits", f"{_RESUBMIT} fewer resources.nodes", never=True
    ),
    "PartitionConfig": PendingReason(
        "it asks for more than any node of the partition has (GPUs, CPUs, memory)",
        f"{_RESUBMIT} less per node, or another resources.partition",
        never=True,
    ),
    "PartitionDown": PendingReason("its partition is down", "wait for the admins to bring it up, or use another one"),
    "PartitionInactive": PendingReason("its partition takes no jobs now", "wait, or use another resources.partition"),
    "ReqNodeNotAvail": PendingReason(
        "nodes it needs are down, drained or reserved",
        "wait for them (clusterkit gpus shows drained nodes), or resubmit without the node list or constraint",
    ),
    "NodeDown": PendingReason("a node it needs is down", "wait for it to return"),
    "BadConstraints": PendingReason(
        "no node matches its constraint (features)", f"{_RESUBMIT} another resources.constraint", never=True
    ),
    "InvalidQOS": PendingReason("its QOS is not valid for it", f"{_RESUBMIT} another resources.qos", never=True),
    "InvalidAccount": PendingReason(
        "its account is not valid for it", f"{_RESUBMIT} another resources.account", never=True
    ),
    "Reservation": PendingReason("it waits for its reservation to start", "wait"),
    "Licenses": PendingReason("it waits for licenses", "wait"),
    "QOSMaxGRESPerUser": PendingReason("your jobs hold as many GPUs as your QOS allows", _LIMIT),
    "QOSMaxJobsPerUserLimit": PendingReason("you run as many jobs as your QOS allows", _LIMIT),
    "QOSMaxNodePerUserLimit": PendingReason("your jobs hold as many nodes as your QOS allows", _LIMIT),
    "QOSMaxCpuPerUserLimit": PendingReason("your jobs hold as many CPUs as your QOS allows", _LIMIT),
    "QOSGrpGRES": PendingReason("the QOS's jobs hold as many GPUs as it allows", _LIMIT),
    "QOSGrpNodeLimit": PendingReason("the QOS's jobs hold as many nodes as it allows", _LIMIT),
    "QOSGrpCpuLimit": PendingReason("the QOS's jobs hold as many CPUs as it allows", _LIMIT),
    "AssocGrpGRES": PendingReason("your account's jobs hold as many GPUs as it allows", _LIMIT),
    "AssocGrpNodeLimit": PendingReason("your account's jobs hold as many nodes as it allows", _LIMIT),
    "AssocGrpCpuLimit": PendingReason("your account's jobs hold as many CPUs as it allows", _LIMIT),
    "AssocMaxJobsLimit": PendingReason("your account runs as many jobs as it allows", _LIMIT),
    "AssocGrpGRESMinutes": PendingReason(
        "your account has used up its GPU-minutes",
        "ask your admins for more, or submit with another resources.account",
    ),
    "AssocGrpCPUMinutesLimit": PendingReason(
        "your account has used up its CPU-minutes",
        "ask your admins for more, or submit with another resources.account",
    ),
    "QOSMaxGRESPerJob": PendingReason(_JOB_LIMIT + " (GPUs)", f"{_RESUBMIT} fewer GPUs", never=True),
    "QOSMaxNodePerJobLimit": PendingReason(_JOB_LIMIT + " (nodes)", f"{_RESUBMIT} fewer resources.nodes", never=True),
    "QOSMaxWallDurationPerJobLimit": PendingReason(
        _JOB_LIMIT + " (time)", f"{_RESUBMIT} a lower resources.time", never=True
    ),
    "AssocMaxGRESPerJob": PendingReason(_JOB_LIMIT + " (GPUs)", f"{_RESUBMIT} fewer GPUs", never=True),
    "AssocMaxNodesPerJobLimit": PendingReason(
        _JOB_LIMIT + " (nodes)", f"{_RESUBMIT} fewer resources.nodes", never=True
    ),
    "AssocMaxWallDurationPerJobLimit": PendingReason(
        _JOB_LIMIT + " (time)", f"{_RESUBMIT} a lower resources.time", never=True
    ),
    "launch_failed_requeued_held": PendingReason(
        "it failed to start, was requeued and held", "see its logs, then scontrol release JOB"
    ),
    "JobHoldMaxRequeue": PendingReason(
        "it was requeued as often as the cluster allows and is held", "see its logs, then submit it again"
    ),
}


def pending_reason(reason: str | None) -> PendingReason | None:
    """The entry for SLURM's reason (its first word: "ReqNodeNotAvail, UnavailableNodes:n1" too)."""
    word = re.match(r"[A-Za-z_]+", reason or "")
    return PENDING_REASONS.get(word.group()) if word else None

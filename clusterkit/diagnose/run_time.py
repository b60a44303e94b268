"""Where a run's allocation went: each allocation's (sacct's row's) seconds cut into buckets at the
runner's events (metrics.jsonl). Pure; :mod:`clusterkit.diagnose.run_report` says how the cut is made
and uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The buckets of the allocation, in the order they are printed.
BUCKETS = ("training", "startup", "checkpointing", "requeues", "retries", "restarts", "hangs", "other")
BUCKET_WORDS = {
    "training": "useful training",
    "startup": "start-up (job start to first step)",
    "checkpointing": "checkpoint saves",
    "requeues": "lost to requeues",
    "retries": "lost to retries",
    "restarts": "lost to restarts",
    "hangs": "lost to hangs",
    "other": "other (shutdown, untracked)",
}


@dataclass(frozen=True)
class Allocation:
    """One job's stay on its nodes (a requeued job has one per instance)."""

    job_id: str
    state: str
    started: float
    ended: float
    gpus: int
    cpus: int
    queue_wait_s: float | None

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.ended - self.started)


@dataclass(frozen=True)
class Share:
    """A bucket of the allocation: seconds of allocation and GPU-hours (CPU-hours on CPU)."""

    bucket: str
    seconds: float
    gpu_hours: float
    cpu_hours: float


@dataclass
class Attempt:
    """One launch of the training: from its ``start`` line to its last line."""

    started: float
    first_step: int
    steps: list[tuple[int, float]] = field(default_factory=list)  # (step, time) of each log line
    saves: list[tuple[int, float, float]] = field(default_factory=list)  # (step, time, seconds) of each save
    last: float = 0.0


def is_number(value: Any) -> bool:
    """A JSON number that is one: Python's json reads NaN and Infinity too, which no time or rate is."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def attempts_in(metrics: list[dict[str, Any]]) -> list[Attempt]:
    attempts: list[Attempt] = []
    for line in metrics:
        when = line.get("time")
        if not is_number(when):
            continue
        if line.get("event") == "start":
            step = line.get("step")
            attempts.append(Attempt(when, step if is_number(step) else 0, last=when))
            continue
        if not attempts:
            continue
        attempt = attempts[-1]
        attempt.last = max(attempt.last, when)
        if line.get("event") == "log" and is_number(line.get("step")):
            attempt.steps.append((line["step"], when))
        elif line.get("event") == "checkpoint" and is_number(line.get("save_s")) and is_number(line.get("step")):
            attempt.saves.append((line["step"], when, max(0.0, line["save_s"])))
    return attempts


def split_allocations(
    allocations: Sequence[Allocation],
    attempts: Sequence[Attempt],
    hang: dict[str, Any] | None,
    restarts: Sequence[dict[str, Any]],
) -> list[Share]:
    seconds = {bucket: [0.0] * len(allocations) for bucket in BUCKETS}  # bucket -> per allocation

    def add(bucket: str, index: int, amount: float) -> None:
        seconds[bucket][index] += max(0.0, amount)

    def holder(when: float) -> int | None:
        for index, allocation in enumerate(allocations):
            if allocation.started - 1 <= when <= allocation.ended + 1:  # sacct's times are whole seconds
                return index
        return None

    placed = [(attempt, holder(attempt.started)) for attempt in attempts]
    hang_at = hang.get("time") if hang and is_number(hang.get("time")) else None
    for index, allocation in enumerate(allocations):
        mine = [attempt for attempt, at in placed if at == index]
        ending = "other" if index == len(allocations) - 1 else _cause(allocation, allocations[index + 1], "other")
        if not mine:  # no first step here: lost to what ended it (the last: not split)
            add(ending, index, allocation.elapsed_s)
            continue
        add(
            "startup" if index == 0 else _cause(allocations[index - 1], allocation, "startup"),
            index,
            mine[0].started - allocation.started,
        )
        for number, attempt in enumerate(mine):
            later = [a for a, _ in placed if a.started > attempt.started]
            kept_until = _kept_until(attempt, later[0].first_step if later else None)
            saving = sum(s for _, when, s in attempt.saves if when <= kept_until)
            add("checkpointing", index, saving)
            add("training", index, kept_until - attempt.started - saving)
            redone = attempt.last - kept_until
            if number + 1 < len(mine):  # a restart in the same allocation (a spare node)
                add("restarts", index, redone + mine[number + 1].started - attempt.last)
            else:
                tail = redone + allocation.ended - attempt.last
                hung = 0.0
                if hang_at is not None and attempt.last <= hang_at <= allocation.ended + 1:
                    hung = min(tail, hang_at - attempt.last)
                    add("hangs", index, hung)
                add(ending, index, tail - hung)
    if not attempts:  # no metrics: the restarts' own records still say what each cost
        for line in restarts:
            began, resumed = line.get("failed_at"), line.get("resumed_at") or line.get("restarted_at")
            at = holder(began) if is_number(began) else None
            if at is not None and is_number(resumed):
                cost = min(max(0.0, resumed - began), seconds["other"][at])
                add("restarts", at, cost)
                seconds["other"][at] -= cost
    shares = []
    for bucket in BUCKETS:
        per = seconds[bucket]
        shares.append(
            Share(
                bucket,
                sum(per),
                sum(s * a.gpus for s, a in zip(per, allocations)) / 3600,
                sum(s * a.cpus for s, a in zip(per, allocations)) / 3600,
            )
        )
    return shares


def _cause(ended: Allocation, next_one: Allocation, planned: str) -> str:
    """Why the run went on in another allocation: the same job requeued, a retry (a new job), or the
    next link of a chain (tasks of one array, one after another), which was planned: ``planned``."""
    if ended.job_id == next_one.job_id:
        return "requeues"
    ended_array, _, ended_task = ended.job_id.partition("_")
    next_array, _, next_task = next_one.job_id.partition("_")
    return planned if ended_task and next_task and ended_array == next_array else "retries"


def _kept_until(attempt: Attempt, resumed_at_step: int | None) -> float:
    """When the attempt's last step that the run kept was logged or saved: a later attempt resuming
    at step S redoes every step after S."""
    if resumed_at_step is None:
        return attempt.last
    kept = [when for step, when in attempt.steps if step <= resumed_at_step]
    kept += [when for step, when, _ in attempt.saves if step <= resumed_at_step]
    return max(kept, default=attempt.started)

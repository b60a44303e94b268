"""Stragglers: a rank that is persistently slower than the others, from the step times each rank of
the built-in runner appends to ``ranks/steps/rank<R>.jsonl`` (one JSON line per optimizer step:
``{"step": N, "step_s": x, "data_s": y, "time": t}``).

What is compared is a rank's own time per step, ``data_s + step_s``. In synchronous data-parallel
training every rank's cycle takes as long as the slowest rank's; the difference is where each
rank waits. The runner measures ``data_s`` (the rank fetching its batch) apart from the exchange
that follows it (the Trainer's token count is a collective, where the fast ranks wait for the slow
one) and ``step_s`` (forward, backward with the gradient sync, optimizer): a rank slow to read its
data shows here. A rank slow in its own forward/backward makes its peers wait inside the gradient
sync, within their ``step_s``, which wall-clock timers cannot tell apart from computing (GPU
utilisation, sampled beside the times, is the sign there).

A rank is a straggler when its median own time over the last ``window`` steps that every rank has
recorded exceeds the median across ranks by more than ``threshold``: the median, so a few slow
steps (a checkpoint save, a garbage collection) do not make one. Standard library only: the job's
supervisor may use it too; status does.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Dict, Mapping, Optional, Sequence, Tuple

from .run_files import STEP_TIMES_DIR, step_times

DEFAULT_THRESHOLD = 0.15  # 15% slower than the median rank
DEFAULT_WINDOW = 10  # the last 10 steps every rank has recorded
MIN_STEPS = 5  # fewer common steps say nothing yet
# Each file's tail that is read: a line is ~100 bytes (~200 with GPU figures), so the window fits many times.
TAIL_BYTES = 32 * 1024
_RANK_FILE = re.compile(r"rank(\d{1,7})\.jsonl")

# rank -> step -> the rank's own time at that step (seconds)
StepTimes = Dict[int, Dict[int, float]]


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: int
    host: Optional[str]
    step_s: float  # the rank's median own time per step over the window
    median_s: float  # the median of every rank's
    first_step: int
    last_step: int

    @property
    def slower(self) -> float:
        """How much slower than the median, as a fraction (0.42 for 42%)."""
        return self.step_s / self.median_s - 1

    @property
    def summary(self) -> str:
        where = f"node{self.node}" + (f" ({self.host})" if self.host else "")
        return (
            f"rank {self.rank} on {where} is {self.slower:.0%} slower than the median step "
            f"({self.step_s:.2f} s vs {self.median_s:.2f} s over steps {self.first_step}-{self.last_step})"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "slower": round(self.slower, 4), "summary": self.summary}


def _own_time(line: str) -> Optional[Tuple[int, float]]:
    """(step, seconds) from one line; None for anything else (a truncated line, NaN, a negative time
    after a clock jump, a boolean where a number belongs)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step, parts = record.get("step"), (record.get("step_s"), record.get("data_s", 0.0))
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0 for p in parts):
        return None
    return step, float(parts[0]) + float(parts[1])


def parse_steps(text: str) -> Dict[int, float]:
    """A rank's step -> own time. A rank that restarted (from a checkpoint) records steps again:
    the later line wins, as it is the run that goes on."""
    found: Dict[int, float] = {}
    for line in text.splitlines():
        parsed = _own_time(line)
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found


def _tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of a regular file, from its first whole line; "" for anything else (a
    FIFO would block a reader: opened without blocking and refused)."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        start = max(0, info.st_size - size)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, size)
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    return text.split("\n", 1)[1] if start and "\n" in text else ("" if start else text)


def read_step_times(run_dir: Path, tail_bytes: int = TAIL_BYTES) -> StepTimes:
    """Every rank's recent step times, from the run directory."""
    times: StepTimes = {}
    for path in sorted((run_dir / STEP_TIMES_DIR).glob(Path(step_times("*")).name)):
        match = _RANK_FILE.fullmatch(path.name)
        if match:
            steps = parse_steps(_tail(path, tail_bytes))
            if steps:
                times[int(match.group(1))] = steps
    return times


def find_straggler(
    times: Mapping[int, Mapping[int, float]],
    ranks_per_node: int,
    hosts: Sequence[str] = (),
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    min_steps: int = MIN_STEPS,
) -> Optional[Straggler]:
    """The slowest rank, where it is more than ``threshold`` slower than the median over the last
    ``window`` steps all ranks recorded (at least ``min_steps`` of them); None otherwise (one rank,
    too few common steps, no rank that slow). ``hosts``: each node's host name, by node number."""
    if len(times) < 2 or ranks_per_node < 1:
        return None
    common = set.intersection(*(set(steps) for steps in times.values()))
    last = sorted(common)[-window:]
    if len(last) < max(1, min_steps):
        return None
    per_rank = {rank: median(steps[s] for s in last) for rank, steps in times.items()}
    middle = median(per_rank.values())
    if middle <= 0:
        return None
    rank = max(per_rank, key=lambda r: (per_rank[r], -r))
    if per_rank[rank] <= middle * (1 + threshold):
        return None
    node = rank // ranks_per_node
    return Straggler(
        rank=rank,
        node=node,
        host=hosts[node] if node < len(hosts) else None,
        step_s=per_rank[rank],
        median_s=middle,
        first_step=last[0],
        last_step=last[-1],
    )


def straggler(
    run_dir: Path, ranks_per_node: int, hosts: Sequence[str] = (), threshold: float = DEFAULT_THRESHOLD
) -> Optional[Straggler]:
    """The run's straggler now, if it has one."""
    return find_straggler(read_step_times(run_dir), ranks_per_node, hosts, threshold)

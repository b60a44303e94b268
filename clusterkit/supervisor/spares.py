"""Hot spares: the allocation holds ``spare_nodes`` more nodes than training uses. When the launch
fails on a node (the node where the failure began, or the nodes of the ranks the watchdog found
elsewhere than the others), that node is dropped and the launch starts again in the same job on the
next spare, resuming from the newest complete checkpoint; the world size and layout stay the plan's.
Each restart is one line of ``restarts.jsonl`` (which node, when, why), read by ``status``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .plan import LaunchPlan
from .recovery import first_failure
from .run_files import RESTARTS, node_exit


@dataclass(frozen=True)
class Restart:
    number: int
    dropped: List[str]
    why: str


class Spares:
    def __init__(self, plan: LaunchPlan, run_dir: Path, job_id: str) -> None:
        self.plan, self.run_dir, self.job_id = plan, run_dir, job_id
        self.dropped: List[str] = []  # failed nodes, in the order they failed; never used again in this job
        self.restarts = 0

    def usable(self, hosts: Sequence[str]) -> List[str]:
        """The allocation without the dropped nodes (training takes the first, the service the last)."""
        return [host for host in hosts if host not in self.dropped]

    def replace(
        self, hosts: Sequence[str], train: Sequence[str], named: Sequence[str] = (), why: str = "it failed"
    ) -> Optional[Restart]:
        """Drop the failed node(s) and say so, where spares can take their places and restarts are
        left; None where the job cannot go on in this allocation. ``named``: the hosts to drop (a
        hang's odd ranks', the preflight's slow ones), else the node where the failure began."""
        if self.restarts >= self.plan.recovery.max_restarts:
            return None
        failed = first_failure(self.run_dir)
        bad = list(named) or ([train[failed[1]]] if failed and failed[1] < len(train) else [])
        if not bad:
            return None
        # The service's nodes are the allocation's last: the pool for training is what comes before.
        pool = [h for h in hosts[: len(hosts) - self.plan.service_nodes] if h not in self.dropped and h not in bad]
        if len(pool) < self.plan.train_nodes:
            return None
        self.restarts += 1
        self.dropped += [host for host in bad if host not in self.dropped]
        why = f"{why} (its failure began on {bad[0]})" if not named else why
        record = {
            "restart": self.restarts,
            "job_id": self.job_id,
            "dropped": bad,
            "why": why,
            "failed_at": failed[0] if failed and not named else time.time(),
            "restarted_at": time.time(),
        }
        with (self.run_dir / RESTARTS).open("a") as out:
            out.write(json.dumps(record) + "\n")
        for path in self.run_dir.glob(node_exit("*")):
            path.unlink()  # the next launch's first failure is its own
        return Restart(self.restarts, bad, why)

    def resumed(self) -> None:
        """The restarted launch made its first progress: when, beside the restart's line."""
        with (self.run_dir / RESTARTS).open("a") as out:
            out.write(json.dumps({"restart": self.restarts, "job_id": self.job_id, "resumed_at": time.time()}) + "\n")

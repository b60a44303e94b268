"""``preemption:``: what a job does when SLURM warns it of its end (a time limit, a preemption) and
after a failure: the signal, requeues, retries as a new job, restarts on a spare node."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class Preemption(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    # SLURM sends this signal `grace_s` seconds before the time limit or a preemption. Not USR1,
    # which NCCL may claim (submitit moved to USR2 for that reason). false: no --signal is asked
    # for, so a job stopped by its time limit gets no chance to checkpoint first.
    signal: Literal["USR2", "TERM", "HUP", "URG", "USR1"] | bool = "USR2"
    grace_s: Annotated[int, Meta(ge=10, le=3600)] = 120
    max_requeues: Annotated[int, Meta(ge=0, le=100)] = 3
    # Retry automatically after a failure (a rank or node died) up to this many times: a new job,
    # excluding the node the failure began on, continues the run directory from its newest complete
    # checkpoint (retries.jsonl records each). 0 = never.
    max_retries: Annotated[int, Meta(ge=0, le=100)] = 0
    # Restarts of the launch on a spare node within the same job (resources.spare_nodes); default:
    # one per spare. Each drops the node the failure began on.
    max_restarts: Annotated[int, Meta(ge=0, le=1024)] | None = None
    # #SBATCH --requeue: auto writes --requeue while max_requeues is above 0 and --no-requeue when it
    # is 0; true/false write that flag; site writes neither (the site's JobRequeue).
    requeue: bool | Literal["auto", "site"] = "auto"

    @property
    def handled_signal(self) -> str:
        """The signal the job's shells and ranks handle (checkpoint, pass on): with signal: false
        SLURM is asked for none, but ``scancel --signal=USR2 --batch`` still works."""
        return self.signal if isinstance(self.signal, str) else "USR2"

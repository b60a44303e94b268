"""Preemption: SLURM's warning signal (``--signal=B:<SIG>@<grace>``) reaches the batch shell, whose
supervisor passes it to every rank. On it, all ranks agree to stop after the current step, save a
checkpoint together, and end with 0 (a non-zero rank would have its launcher and srun end the other
nodes' ranks, rank 0 perhaps before its record is written); the supervisor, seeing the record,
requeues the job while fewer than ``max_requeues`` restarts have happened, and the requeued job
resumes from that checkpoint."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from clusterkit.runtime.rank_exit import write_durably
from clusterkit.spec.layout import PREEMPTED_RECORD


class PreemptionHandler(TrainerCallback):
    def __init__(self, run_dir: Path, signal_name: str | None):
        self.run_dir = run_dir
        self.requested = False
        self.stopped_at: int | None = None
        self.signal_name = signal_name
        if signal_name:
            signal.signal(getattr(signal, f"SIG{signal_name}"), self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.requested = True

    def _anyone_requested(self) -> bool:
        # Ranks get the signal at slightly different times: agree, so that all stop at the same step.
        if not (dist.is_available() and dist.is_initialized()):
            return self.requested
        flag = torch.tensor(
            [1 if self.requested else 0], dtype=torch.int32, device="cuda" if dist.get_backend() == "nccl" else "cpu"
        )
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self.signal_name and self._anyone_requested():
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
        return control

    @property
    def preempted(self) -> bool:
        return self.stopped_at is not None

    def finish(self, is_rank_zero: bool) -> int:
        """After training stopped for preemption (a checkpoint saved): rank 0 records the step, and
        every rank ends with 0. The job's supervisor, on the batch host, then requeues the job or
        completes the record with why not and ends the job with EXIT_PREEMPTED (an image seldom has
        scontrol)."""
        if is_rank_zero:
            write_durably(self.run_dir / PREEMPTED_RECORD, json.dumps({"step": self.stopped_at}) + "\n")
            print(f"clusterkit: preempted at step {self.stopped_at}: checkpoint saved", flush=True)
        return 0

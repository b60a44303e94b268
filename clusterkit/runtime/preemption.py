"""Preemption: SLURM's warning signal (``--signal=B:<SIG>@<grace>``) reaches the batch shell, which
passes it to every rank. On it, all ranks agree to stop after the current step, save a checkpoint
together, and rank 0 requeues the job (``scontrol requeue``) while fewer than ``max_requeues``
restarts have happened; the requeued job resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from clusterkit.runs.layout import PREEMPTED_RECORD, REQUEUED
from clusterkit.runtime.rank_exit import write_durably

# Exit code of the ranks when the job stopped for preemption without being requeued.
EXIT_PREEMPTED = 85


class PreemptionHandler(TrainerCallback):
    def __init__(self, run_dir: Path, signal_name: str | None, max_requeues: int):
        self.run_dir = run_dir
        self.max_requeues = max_requeues
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
        """After training stopped for preemption: requeue (rank 0) or record why not. Returns the
        exit code every rank should end with."""
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        job_id = os.environ.get("SLURM_JOB_ID")
        requeue = (
            job_id is not None and restarts < self.max_requeues and os.environ.get("CLUSTERKIT_EXECUTOR") != "local"
        )
        if is_rank_zero:
            if requeue:
                print(
                    f"clusterkit: preempted at step {self.stopped_at}; requeueing job {job_id} "
                    f"(restart {restarts + 1} of at most {self.max_requeues})",
                    flush=True,
                )
                # Before the requeue: the batch script may reach its end before SLURM stops it, and
                # must then keep what the next start reads (the secrets file).
                write_durably(
                    self.run_dir / REQUEUED, json.dumps({"step": self.stopped_at, "restart": restarts + 1}) + "\n"
                )
                if subprocess.run(["scontrol", "requeue", job_id], check=False).returncode != 0:
                    (self.run_dir / REQUEUED).unlink(missing_ok=True)  # not started again: this was the end
            else:
                reason = (
                    f"max_requeues ({self.max_requeues}) reached"
                    if job_id and restarts >= self.max_requeues
                    else "no SLURM job to requeue"
                )
                write_durably(
                    self.run_dir / PREEMPTED_RECORD,
                    json.dumps(
                        {
                            "step": self.stopped_at,
                            "restarts": restarts,
                            "max_requeues": self.max_requeues,
                            "reason": reason,
                        }
                    )
                    + "\n",
                )
                print(
                    f"clusterkit: preempted at step {self.stopped_at}; {reason}: not requeued. "
                    f"Continue with: clusterkit submit --resume {self.run_dir}",
                    flush=True,
                )
        return 0 if requeue else EXIT_PREEMPTED

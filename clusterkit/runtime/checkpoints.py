"""Checkpoints that are safe to resume from. HF Trainer writes ``checkpoint-N`` in place, so a
checkpoint counts only once every rank has finished writing it: then rank 0 drops a completion
marker into it, replaces ``latest`` (write to a temporary name, rename) and only then rotates old
checkpoints away (the Trainer's own rotation is switched off: it deletes the previous checkpoint
before the new one is complete). Resume takes the newest complete checkpoint whose files are
intact, and removes incomplete ones, so a half-written checkpoint is never used."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from clusterkit.runs.checkpoint_files import checkpoints_dir, newest_usable, remove_incomplete, rotate, set_aside
from clusterkit.spec.layout import COMPLETE, LATEST, checkpoint_name


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def prepare_own_dir(own_dir: Path) -> None:
    """Rank 0, before any rank looks for a checkpoint: remove incomplete ones, set damaged ones aside."""
    for removed in remove_incomplete(own_dir):
        print(f"clusterkit: removed incomplete checkpoint {removed}", flush=True)
    _, damaged = newest_usable(own_dir)
    for checkpoint, problem in damaged:
        print(
            f"clusterkit: checkpoint {checkpoint} is damaged ({problem}); moved to {set_aside(checkpoint)}", flush=True
        )


def resume_point(own_dir: Path, resume_from: str | None, report: bool) -> Path | None:
    """This run's newest usable checkpoint (a requeued job continues itself), else that of the run
    named by resume_from (a run directory or its checkpoints directory). A resume_from without a
    usable checkpoint is an error: training from step 0 instead would silently redo the run."""
    found, _ = newest_usable(own_dir)
    if found or not resume_from:
        return found
    earlier = checkpoints_dir(Path(resume_from))
    found, damaged = newest_usable(earlier)
    if report:
        for checkpoint, problem in damaged:
            print(f"clusterkit: not resuming from {checkpoint}: {problem}; trying the previous one", flush=True)
    if found is None:
        raise FileNotFoundError(f"resume_from {resume_from}: no complete, intact checkpoint under {earlier}")
    return found


class CheckpointPublisher(TrainerCallback):
    """After every save: wait for all ranks, then rank 0 marks the checkpoint complete, points
    ``latest`` at it and removes complete checkpoints beyond the newest ``keep`` (the recipe's
    save_total_limit; None keeps all), and hands ``record`` how long the save took (the metrics'
    ``checkpoint`` line, which `clusterkit report` counts as checkpointing time)."""

    def __init__(self, keep: int | None, record: Callable[[dict[str, Any]], None] | None = None):
        self.keep = keep
        self.record = record
        # Writes the full model into a checkpoint, where the framework's own save holds shards that
        # export cannot join (AutoTP); called on every rank (it gathers), before the checkpoint is complete.
        self.consolidate: Callable[[Path], None] | None = None
        self._save_began: float | None = None

    # A save follows its step's end and log line (whichever callback asked for it: the Trainer's
    # save_steps, or the preemption handler after this one): it is what lies between the last of
    # these and on_save.
    def on_step_end(self, args, state, control, **kwargs):
        self._save_began = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._save_began = time.time()

    def on_save(self, args, state, control, **kwargs):
        _barrier()
        output_dir = Path(args.output_dir)
        checkpoint = output_dir / checkpoint_name(state.global_step)
        if self.consolidate is not None:
            self.consolidate(checkpoint)
            _barrier()
        if state.is_world_process_zero:
            (checkpoint / COMPLETE).write_text(f"{state.global_step}\n")
            staging = output_dir / f".{LATEST}.tmp"
            staging.write_text(f"{checkpoint.name}\n")
            os.replace(staging, output_dir / LATEST)
            if self.keep:
                best = state.best_model_checkpoint
                rotate(output_dir, self.keep, Path(best) if best else None)
        _barrier()
        if state.is_world_process_zero and self.record is not None and self._save_began is not None:
            now = time.time()
            self.record(
                {"event": "checkpoint", "time": now, "step": state.global_step, "save_s": now - self._save_began}
            )

"""Checkpoints that are safe to resume from. HF Trainer writes ``checkpoint-N`` in place, so a
checkpoint counts only once every rank has finished writing it: then rank 0 drops a completion
marker into it and replaces ``latest`` (write to a temporary name, rename). Resume takes the newest
complete checkpoint and removes incomplete ones, so a half-written checkpoint is never used."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch.distributed as dist
from transformers import TrainerCallback

COMPLETE = ".clusterkit-complete"
LATEST = "latest"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _step(path: Path) -> int:
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else -1


def complete_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _step(p) >= 0 and (p / COMPLETE).exists()]
    return sorted(found, key=_step)


def remove_incomplete(directory: Path) -> list[Path]:
    """Delete checkpoint folders without the completion marker (an interrupted write)."""
    removed = []
    if directory.is_dir():
        for path in directory.iterdir():
            if _step(path) >= 0 and not (path / COMPLETE).exists():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def newest_complete(own_dir: Path, resume_from: str | None) -> Path | None:
    """This run's newest complete checkpoint (a requeued job continues itself), else that of the
    run named by resume_from (a run directory or its checkpoints directory)."""
    candidates = [own_dir]
    if resume_from:
        earlier = Path(resume_from)
        candidates.append(earlier / "checkpoints" if (earlier / "checkpoints").is_dir() else earlier)
    for directory in candidates:
        found = complete_checkpoints(directory)
        if found:
            return found[-1]
    return None


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class CheckpointPublisher(TrainerCallback):
    """After every save: wait for all ranks, then rank 0 marks the checkpoint complete and points
    ``latest`` at it."""

    def on_save(self, args, state, control, **kwargs):
        _barrier()
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (checkpoint / COMPLETE).write_text(f"{state.global_step}\n")
            staging = Path(args.output_dir) / f".{LATEST}.tmp"
            staging.write_text(f"{checkpoint.name}\n")
            os.replace(staging, Path(args.output_dir) / LATEST)
        _barrier()

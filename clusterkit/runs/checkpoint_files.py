"""Checkpoint folders on disk, without torch (the CLI uses this too). A checkpoint counts once every
rank finished writing it and rank 0 dropped the completion marker into it; it is usable when, in
addition, its files are what they claim to be (a node that crashed after the marker may leave a
truncated file). Rotation removes old checkpoints only after a newer one is complete."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
import zipfile
from pathlib import Path

from clusterkit.spec.layout import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS_DIR,
    COMPLETE,
    DAMAGED_INFIX,
    REMOVING_PREFIX,
    TRAINER_STATE,
)

_CHECKPOINT = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")


def step(path: Path) -> int:
    """N for a ``checkpoint-N`` folder, -1 for anything else."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else -1


def complete_checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if step(p) >= 0 and (p / COMPLETE).exists()]
    return sorted(found, key=step)


def _remove(path: Path) -> None:
    hidden = path.with_name(f"{REMOVING_PREFIX}{path.name}")
    shutil.rmtree(hidden, ignore_errors=True)  # left by an interrupted removal of the same step
    os.replace(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def remove_incomplete(directory: Path) -> list[Path]:
    """Delete checkpoint folders without the completion marker (an interrupted write), and what an
    interrupted removal left."""
    removed = []
    if directory.is_dir():
        for path in directory.iterdir():
            if path.name.startswith(REMOVING_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
            elif step(path) >= 0 and not (path / COMPLETE).exists():
                _remove(path)
                removed.append(path)
    return removed


def rotate(directory: Path, keep: int, protected: Path | None = None) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints (at least one) and ``protected`` (the Trainer's
    best checkpoint); remove older complete ones. Incomplete folders (the one being written) are
    never touched here."""
    complete = complete_checkpoints(directory)
    kept = set(complete[-max(1, keep) :])
    removed = []
    for path in complete:
        if path not in kept and (protected is None or path.resolve() != protected.resolve()):
            _remove(path)
            removed.append(path)
    return removed


def _safetensors_damage(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            return f"truncated: {size} bytes, no header"
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > size:
            return f"truncated: header of {header_len} bytes, file has {size}"
        try:
            header = json.loads(stream.read(header_len))
        except ValueError:
            return "unreadable header"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    return None if size == expected else f"truncated: {size} of {expected} bytes"


def _torch_file_damage(path: Path) -> str | None:
    # torch.save writes a zip archive whose index sits at the end: a cut-off file has none.
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path):
                return None
        except (zipfile.BadZipFile, OSError) as exc:
            return f"damaged archive ({exc})"
    with path.open("rb") as stream:
        # The legacy (pre-zip) torch.save format is a pickle; nothing cheaper to check than its start.
        return None if stream.read(1) == b"\x80" else "neither a zip archive nor a pickle (truncated or overwritten)"


def _json_damage(path: Path) -> str | None:
    try:
        json.loads(path.read_bytes())
    except ValueError as exc:
        return f"unreadable JSON ({exc})"
    return None


_CHECKS = {
    ".safetensors": _safetensors_damage,
    ".json": _json_damage,
    ".pt": _torch_file_damage,
    ".pth": _torch_file_damage,
    ".bin": _torch_file_damage,
}


def damage(checkpoint: Path) -> str | None:
    """``"<file>: <what is wrong>"`` for the first file of the checkpoint that is not what its name
    says (header, size and index only: no tensor is read); None when all are intact."""
    if not (checkpoint / TRAINER_STATE).is_file():
        return f"{checkpoint / TRAINER_STATE}: missing"
    for path in sorted(checkpoint.rglob("*")):
        check = _CHECKS.get(path.suffix)
        if check is None or not path.is_file():
            continue
        try:
            problem = check(path)
        except OSError as exc:
            problem = f"unreadable ({exc.strerror})"
        if problem:
            return f"{path}: {problem}"
    return None


def checkpoints_dir(run_dir: Path) -> Path:
    """A run directory's checkpoints folder (a checkpoints folder given directly is taken as is)."""
    return run_dir / CHECKPOINTS_DIR if (run_dir / CHECKPOINTS_DIR).is_dir() else run_dir


def newest_usable(directory: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint whose files are intact, and the newer complete ones skipped
    with what is wrong in each."""
    skipped = []
    for checkpoint in reversed(complete_checkpoints(directory)):
        problem = damage(checkpoint)
        if problem is None:
            return checkpoint, skipped
        skipped.append((checkpoint, problem))
    return None, skipped


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged checkpoint out of the way (kept for inspection): training will write a
    checkpoint of the same step again, which must not land in a folder already marked complete."""
    target = checkpoint.with_name(f"{checkpoint.name}{DAMAGED_INFIX}{int(time.time())}")
    os.replace(checkpoint, target)
    return target

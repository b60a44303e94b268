"""Writing a render into a directory (``clusterkit render -o DIR``) without ever deleting or moving
anything clusterkit did not write.

A directory clusterkit rendered holds a marker file listing what it wrote. Into a new or empty
directory the files are written; a previous render (marker present, nothing else in it) is replaced
whole, atomically where the kernel can swap two directories; anything else is refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from clusterkit.errors import RenderTargetError

MARKER = ".clusterkit-render"
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def write_render(files: Mapping[str, str], out_dir: Path, description: str) -> Path:
    """Write ``files`` (name → text) into ``out_dir``, all or none; returns the directory written."""
    out_dir = Path(os.path.abspath(out_dir))  # `-o .` has a name and a parent to stage beside
    try:
        if out_dir.is_symlink() and out_dir.is_dir():
            out_dir = out_dir.resolve()  # a link to the user's render folder: render into its target
        if not out_dir.exists() and not out_dir.is_symlink():
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            staging = _stage(files, out_dir, description)
            _swap_in(staging, out_dir, replace=False)
        elif not out_dir.is_dir():
            raise RenderTargetError(f"{out_dir} exists and is not a directory: give a new or empty directory to render into")
        elif not any(out_dir.iterdir()):
            _fill_empty(files, out_dir, description)
        else:
            _check_previous_render(out_dir)
            staging = _stage(files, out_dir, description)
            _swap_in(staging, out_dir, replace=True)
    except OSError as exc:
        raise RenderTargetError(f"cannot write the render to {out_dir}: {exc.strerror or exc}") from None
    return out_dir


def _check_previous_render(out_dir: Path) -> None:
    """Only a directory that holds exactly what an earlier render wrote may be replaced."""
    marker = out_dir / MARKER
    refuse = (f"{out_dir} is not empty and is not an earlier clusterkit render (no {MARKER} marker); "
              f"clusterkit never deletes what it did not write: give a new or empty directory")
    try:
        written = set(json.loads(marker.read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise RenderTargetError(refuse) from None
    written |= {name.split("/")[0] for name in written}  # a sweep point's folder
    foreign = sorted(entry.name for entry in out_dir.iterdir() if entry.name not in written | {MARKER})
    if foreign:
        raise RenderTargetError(f"{out_dir} is an earlier render but also holds {', '.join(foreign[:5])}, which "
                                f"clusterkit did not write: move them away or give another directory")


def _marker_text(files: Mapping[str, str], description: str) -> str:
    return json.dumps({"rendered_by": description, "files": sorted(files)}, indent=1) + "\n"


def _write_file(path: Path, text: str) -> None:
    path.parent.mkdir(exist_ok=True)  # a sweep point's files are in <index>/
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755 if path.name.endswith(".sbatch") else 0o644)


def _stage(files: Mapping[str, str], out_dir: Path, description: str) -> Path:
    """The whole render in a hidden sibling of ``out_dir``; removed again on any failure or Ctrl-C."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, text in files.items():
            _write_file(staging / name, text)
        (staging / MARKER).write_text(_marker_text(files, description), encoding="utf-8")
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _swap_in(staging: Path, out_dir: Path, replace: bool) -> None:
    """Move the staged render to ``out_dir``; an earlier render there is exchanged for it in one
    step (renameat2 RENAME_EXCHANGE), so readers see the old files or the new, never neither."""
    try:
        if not replace:
            os.rename(staging, out_dir)  # fails rather than replace a non-empty directory
            return
        if not _exchange(staging, out_dir):
            # No atomic exchange here (another kernel or libc): move the old render aside first.
            aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.rename(out_dir, aside / "render")
            os.rename(staging, out_dir)
            staging = aside
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging)  # now the earlier render, which clusterkit wrote


def _exchange(a: Path, b: Path) -> bool:
    # CDLL(None): the symbols already loaded (libc's among them), without a library search.
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this filesystem cannot exchange
        return False
    raise OSError(errno, os.strerror(errno), str(b))


def _fill_empty(files: Mapping[str, str], out_dir: Path, description: str) -> None:
    """Write into the user's empty directory itself (it is not replaced); what was written is
    removed again if any file fails."""
    written: list[Path] = []
    try:
        for name, text in [*files.items(), (MARKER, _marker_text(files, description))]:
            path = out_dir / name
            written.append(path)
            _write_file(path, text)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        for folder in {path.parent for path in written} - {out_dir}:
            shutil.rmtree(folder, ignore_errors=True)  # a folder this render created, emptied above
        raise

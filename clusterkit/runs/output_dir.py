"""An output folder a command writes (``render -o DIR``, ``export -o DIR``), without ever deleting or
moving anything clusterkit did not write.

A folder clusterkit wrote holds a marker naming what kind of output it is and listing its files
(:data:`~clusterkit.spec.layout.OUTPUT_MARKERS`). Into a new or empty folder the output is written;
an earlier output of the same kind (its marker present, nothing else in it) is replaced whole,
atomically where the kernel can swap two directories; anything else is refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from clusterkit.errors import OutputDirError
from clusterkit.spec.bounded_read import RECORD_LIMIT, InputFileError, read_bounded
from clusterkit.spec.layout import OUTPUT_MARKERS, OutputKind

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def write_output(out_dir: Path, kind: OutputKind, description: str, fill: Callable[[Path], None]) -> Path:
    """``fill(folder)`` writes the output into an empty folder; it becomes ``out_dir``, all or none.
    Returns the directory written."""
    out_dir = _target(out_dir)
    try:
        state = _state(out_dir, kind)
        if state == "new":
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            _swap_in(_stage(out_dir, kind, description, fill), out_dir, replace=False)
        elif state == "empty":
            _fill_empty(out_dir, kind, description, fill)
        else:
            _swap_in(_stage(out_dir, kind, description, fill), out_dir, replace=True)
    except OSError as exc:
        raise OutputDirError(f"cannot write the {kind} to {out_dir}: {exc.strerror or exc}") from None
    return out_dir


def check_output_dir(out_dir: Path, kind: OutputKind) -> None:
    """Refuse now what :func:`write_output` would refuse (before an export spends minutes loading)."""
    target = _target(out_dir)
    try:
        _state(target, kind)
    except OSError as exc:
        raise OutputDirError(f"cannot write the {kind} to {target}: {exc.strerror or exc}") from None


def _target(out_dir: Path) -> Path:
    out_dir = Path(os.path.abspath(out_dir))  # `-o .` has a name and a parent to stage beside
    if out_dir.is_symlink() and out_dir.is_dir():
        return out_dir.resolve()  # a link to the user's output folder: write into its target
    return out_dir


def _state(out_dir: Path, kind: OutputKind) -> str:
    """ "new", "empty" or "earlier" (an earlier output of this kind, which may be replaced)."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return "new"
    if not out_dir.is_dir():
        raise OutputDirError(
            f"{out_dir} exists and is not a directory: give a new or empty directory to write the {kind} into"
        )
    if not any(out_dir.iterdir()):
        return "empty"
    _check_earlier(out_dir, kind)
    return "earlier"


def _check_earlier(out_dir: Path, kind: OutputKind) -> None:
    """Only a directory that holds exactly what an earlier output of this kind wrote may be replaced."""
    marker = OUTPUT_MARKERS[kind]
    refuse = (
        f"{out_dir} is not empty and is not an earlier clusterkit {kind} (no {marker} marker); "
        f"clusterkit never deletes what it did not write: give a new or empty directory"
    )
    try:
        written = set(json.loads(read_bounded(out_dir / marker, RECORD_LIMIT, f"a {kind} marker"))["files"])
    except (OSError, ValueError, KeyError, TypeError, InputFileError):
        raise OutputDirError(refuse) from None
    written |= {name.split("/")[0] for name in written}  # a sweep point's folder
    foreign = sorted(entry.name for entry in out_dir.iterdir() if entry.name not in written | {marker})
    if foreign:
        raise OutputDirError(
            f"{out_dir} is an earlier {kind} but also holds {', '.join(foreign[:5])}, which "
            f"clusterkit did not write: move them away or give another directory"
        )


def _filled(folder: Path, kind: OutputKind, description: str, fill: Callable[[Path], None]) -> None:
    """``fill`` the empty ``folder``, then its marker listing every file written."""
    fill(folder)
    files = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if not path.is_dir())
    text = json.dumps({"kind": kind, "written_by": description, "files": files}, indent=1) + "\n"
    (folder / OUTPUT_MARKERS[kind]).write_text(text, encoding="utf-8")


def _stage(out_dir: Path, kind: OutputKind, description: str, fill: Callable[[Path], None]) -> Path:
    """The whole output in a hidden sibling of ``out_dir``; removed again on any failure or Ctrl-C."""
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _filled(staging, kind, description, fill)
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _swap_in(staging: Path, out_dir: Path, replace: bool) -> None:
    """Move the staged output to ``out_dir``; an earlier one there is exchanged for it in one step
    (renameat2 RENAME_EXCHANGE), so readers see the old files or the new, never neither."""
    try:
        if not replace:
            os.rename(staging, out_dir)  # fails rather than replace a non-empty directory
            return
        if not _exchange(staging, out_dir):
            # No atomic exchange here (another kernel or libc): move the old output aside first.
            aside = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
            os.rename(out_dir, aside / "output")
            os.rename(staging, out_dir)
            staging = aside
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging)  # now the earlier output, which clusterkit wrote


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


def _fill_empty(out_dir: Path, kind: OutputKind, description: str, fill: Callable[[Path], None]) -> None:
    """Into the user's empty directory itself (it is not replaced: it may be their shell's folder):
    staged in a hidden folder inside it, then moved up, the marker last; what was moved is removed
    again if anything fails."""
    staging = Path(tempfile.mkdtemp(prefix=".clusterkit-staging.", dir=out_dir))
    moved: list[Path] = []
    try:
        _filled(staging, kind, description, fill)
        marker = OUTPUT_MARKERS[kind]
        for name in sorted(os.listdir(staging), key=lambda name: name == marker):
            if os.path.lexists(out_dir / name):
                raise FileExistsError(17, "appeared while the output was written", str(out_dir / name))
            os.rename(staging / name, out_dir / name)
            moved.append(out_dir / name)
    except BaseException:
        for path in moved:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""The code snapshot of a request: which files are copied into ``<run dir>/code`` (fixed by the dry
run, with the commit and whether the tree was dirty) and the tar that carries them there.

One path for every adapter: the files go into a tar built here (modes kept, symlinks kept as links,
never followed), which the local executor and the SLURM adapter unpack into the staging directory
and the SSH adapter sends through its session to ``tar -x`` on the login node. A git work tree gives
its tracked files as they are on disk (``git archive HEAD`` with the uncommitted diff applied: the
same bytes, without the round trip through a patch) and its untracked files that .gitignore does
not exclude; a plain folder gives everything under it. Either way DEFAULT_EXCLUDE, the recipe's
``snapshot.exclude`` and the runs directory (a run's files, or a .git in it, are never code) are left out.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from clusterkit.errors import SubmitError, UsageError
from clusterkit.spec.snapshot import DEFAULT_EXCLUDE, CodeSnapshot

_GIT_ENV = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # read-only: concurrent submits never meet on index.lock


@dataclass(frozen=True)
class Inventory:
    root: str  # the folder copied, on this machine
    git: bool  # a git work tree (else a folder copy)
    files: tuple[str, ...]  # POSIX paths relative to root: files and symlinks that stay inside root
    commit: str | None  # git: HEAD (None before the first commit, or a folder copy)
    dirty: bool | None  # git: whether the copied files differ from HEAD (None: a folder copy)
    size: int  # bytes, the files' sizes together
    left_out: tuple[str, ...]  # what is not copied and why: "link -> /elsewhere (points outside)"

    def describe(self) -> str:
        """One line for the dry run and the submit."""
        where = (f"git tree {self.root} at {self.commit[:12] if self.commit else 'no commit yet'}"
                 f"{' + uncommitted changes' if self.dirty else ''}") if self.git else f"folder {self.root}"
        left = f"; left out: {', '.join(self.left_out)}" if self.left_out else ""
        return f"{len(self.files)} files ({_mb(self.size)}) of {where}{left}"


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _git(root: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, check=False, env=_GIT_ENV)


def _excluded(relative: str, patterns: tuple[str, ...]) -> bool:
    parts = PurePosixPath(relative).parts
    return any(fnmatch.fnmatchcase(part, pattern) for part in parts for pattern in patterns) \
        or any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)


def _candidates(snapshot: CodeSnapshot, skipped: Callable[[str], bool]) -> list[str]:
    """Every path the snapshot might hold, relative to its root (a skipped folder is not entered)."""
    if snapshot.git:
        listed = _git(snapshot.root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        if listed.returncode != 0:
            raise SubmitError(f"git ls-files in {snapshot.root} failed: {listed.stderr.decode(errors='replace').strip()}")
        return sorted({os.fsdecode(name) for name in listed.stdout.split(b"\0") if name})
    found = []
    for folder, dirs, files in os.walk(snapshot.root):  # symlinked folders are listed, never entered
        base = os.path.relpath(folder, snapshot.root)
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links and not skipped(os.path.normpath(os.path.join(base, d)))]
        found += [os.path.normpath(os.path.join(base, name)) for name in [*files, *links]]
    return sorted(found)


def take_inventory(snapshot: CodeSnapshot, runs: tuple[Path, ...]) -> Inventory:
    """The files to copy, the commit and dirtiness; a snapshot over ``max_mb`` is refused. ``runs``:
    the runs directory and what clusterkit keeps in it, left out where they lie inside the tree."""
    root = os.path.realpath(snapshot.root)
    patterns = (*DEFAULT_EXCLUDE, *snapshot.exclude)
    inside = [os.path.relpath(os.path.realpath(folder), root) for folder in runs]
    runs_inside = tuple(folder for folder in inside if folder != "." and not folder.startswith(".."))

    def skipped(relative: str) -> bool:
        return _excluded(relative, patterns) or any(relative == folder or relative.startswith(folder + os.sep)
                                                     for folder in runs_inside)

    files, left_out, size, untracked = [], [], 0, False
    tracked = set()
    if snapshot.git:
        tracked = {os.fsdecode(name) for name in _git(root, "ls-files", "-z", "--cached").stdout.split(b"\0") if name}
    for relative in _candidates(snapshot, skipped):
        relative = relative.rstrip("/")
        if skipped(relative):
            continue
        path = os.path.join(root, relative)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # deleted in the work tree: the uncommitted diff removes it
        if stat.S_ISLNK(info.st_mode):
            target = os.path.realpath(path)
            if os.path.commonpath([target, root]) != root:
                left_out.append(f"{relative} -> {os.readlink(path)} (points outside)")
                continue
        elif stat.S_ISDIR(info.st_mode):
            left_out.append(f"{relative}/ (a submodule or nested git repository)")
            continue
        elif not stat.S_ISREG(info.st_mode):
            left_out.append(f"{relative} (not a file)")
            continue
        files.append(relative)
        size += info.st_size
        untracked = untracked or (snapshot.git and relative not in tracked)
    if size > snapshot.max_mb * 1_000_000:
        raise UsageError(f"snapshot: {snapshot.root} holds {_mb(size)} in {len(files)} files, over snapshot.max_mb "
                         f"{snapshot.max_mb}: exclude paths (snapshot.exclude), raise max_mb, or submit --no-snapshot")
    commit = dirty = None
    if snapshot.git:
        head = _git(root, "rev-parse", "--verify", "-q", "HEAD")
        commit = head.stdout.decode().strip() if head.returncode == 0 else None
        changed = _git(root, "diff", "--quiet", "HEAD", "--") if commit else None
        dirty = untracked or commit is None or (changed is not None and changed.returncode != 0)
    return Inventory(root=root, git=snapshot.git, files=tuple(files), commit=commit, dirty=dirty, size=size, left_out=tuple(left_out))


def tar_bytes(inventory: Inventory) -> bytes:
    """The files as a tar: paths relative to the snapshot folder, modes kept, no owner."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative in inventory.files:
            path = os.path.join(inventory.root, relative)
            try:
                info = tar.gettarinfo(path, arcname=relative)
            except FileNotFoundError:
                continue  # removed since the dry run listed it
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.issym():  # inside the tree (checked when listed): as a relative link, so it points into the copy
                info.linkname = os.path.relpath(os.path.realpath(path), os.path.dirname(os.path.join(inventory.root, relative)))
                tar.addfile(info)
            elif info.isreg():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
    return buffer.getvalue()


def unpack(data: bytes, folder: str) -> None:
    """Unpack a snapshot's tar into ``folder`` on this machine (created), modes kept."""
    os.makedirs(folder, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="tar")  # refuses absolute paths and links leading out of folder

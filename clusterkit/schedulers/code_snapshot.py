"""The code snapshot of a request: which files are copied into ``<run dir>/code`` (fixed by the dry
run, with the commit and whether the tree was dirty) and the tar that carries them there.

One path for every adapter: the files go into a tar built here (modes kept, symlinks kept as links,
never followed), which the local executor and the SLURM adapter unpack into the staging directory
and the SSH adapter sends through its session to ``tar -x`` on the login node. A git work tree gives
its tracked files as they are on disk (``git archive HEAD`` with the uncommitted diff applied: the
same bytes, without the round trip through a patch) and its untracked files that .gitignore does
not exclude; a plain folder gives everything under it. Either way DEFAULT_EXCLUDE, the recipe's
``snapshot.exclude`` and the runs directory (a run's files, or a .git in it, are never code) are left out,
and so is, at any depth, every folder clusterkit wrote: a run directory of another runs_dir or of a
sweep (it holds a run record, and a secrets file: copied, it would travel with each later run, nested
run after run) and a ``render -o``/``export -o`` folder; and any file named as a run's secrets file.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from clusterkit.errors import BadRunRecord, SubmitError, UsageError, printable
from clusterkit.load.snapshot import git
from clusterkit.runs.record import read_record
from clusterkit.spec.layout import OUTPUT_MARKERS, RUN_RECORD, SECRETS_FILE, STAGING_PREFIX
from clusterkit.spec.snapshot import DEFAULT_EXCLUDE, CodeSnapshot


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
        """One line for the dry run and the submit; a file name's escape sequences and line breaks
        are shown escaped, never sent to the terminal."""
        where = (
            (
                f"git tree {self.root} at {self.commit[:12] if self.commit else 'no commit yet'}"
                f"{' + uncommitted changes' if self.dirty else ''}"
            )
            if self.git
            else f"folder {self.root}"
        )
        more = f" and {len(self.left_out) - 5} more" if len(self.left_out) > 5 else ""
        left = f"; left out: {', '.join(self.left_out[:5])}{more}" if self.left_out else ""
        return printable(f"{len(self.files)} files ({_mb(self.size)}) of {where}{left}")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _excluded(relative: str, patterns: tuple[str, ...]) -> bool:
    parts = PurePosixPath(relative).parts
    return any(fnmatch.fnmatchcase(part, pattern) for part in parts for pattern in patterns) or any(
        fnmatch.fnmatchcase(relative, pattern) for pattern in patterns
    )


def _written_by_clusterkit(folder: str) -> str | None:
    """What clusterkit wrote ``folder`` as ("a clusterkit run directory", "a clusterkit render"), or
    None. A run.json counts only when it is a run record: a code file may have that name."""
    for kind, marker in OUTPUT_MARKERS.items():
        if os.path.isfile(os.path.join(folder, marker)):
            return f"a clusterkit {kind}"
    if os.path.basename(folder).startswith(STAGING_PREFIX):
        return "a clusterkit run directory"  # a submit's, before its job had an id
    if os.path.isfile(os.path.join(folder, RUN_RECORD)):
        try:
            read_record(Path(folder))
        except BadRunRecord:
            return None
        return "a clusterkit run directory"
    return None


def _candidates(snapshot: CodeSnapshot, skipped: Callable[[str], bool]) -> Iterator[str]:
    """Every path the snapshot might hold, relative to its root (a skipped folder is not entered),
    as the folder is walked: the size guard can stop a walk of a huge tree early."""
    if snapshot.git:
        listed = git(snapshot.root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        if listed.returncode != 0:
            raise SubmitError(
                f"git ls-files in {snapshot.root} failed: {listed.stderr.decode(errors='replace').strip()}"
            )
        yield from sorted({os.fsdecode(name) for name in listed.stdout.split(b"\0") if name})
        return
    for folder, dirs, files in os.walk(snapshot.root):  # symlinked folders are listed, never entered
        base = os.path.relpath(folder, snapshot.root)
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links and not skipped(os.path.normpath(os.path.join(base, d)))]
        yield from (os.path.normpath(os.path.join(base, name)) for name in [*files, *links])


def _looked_at(path: str, root: str) -> tuple[int, str | None]:
    """A listed path's size, or why it is left out (FileNotFoundError: gone since it was listed)."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):  # never followed: copied as a link where it points inside the tree
            inside = os.path.commonpath([os.path.realpath(path), root]) == root
            return info.st_size, None if inside else f" -> {os.readlink(path)} (points outside)"
    except FileNotFoundError:
        raise
    except OSError as exc:
        return 0, f" (cannot be read: {exc.strerror})"
    if stat.S_ISDIR(info.st_mode):
        return 0, "/ (a submodule or nested git repository)"
    if not stat.S_ISREG(info.st_mode):
        return 0, " (not a file)"
    return info.st_size, None if os.access(path, os.R_OK) else " (cannot be read: permission denied)"


def take_inventory(snapshot: CodeSnapshot, runs: tuple[Path, ...]) -> Inventory:
    """The files to copy, the commit and dirtiness; a snapshot over ``max_mb`` is refused. ``runs``:
    the runs directory and what clusterkit keeps in it, left out where they lie inside the tree."""
    root = os.path.realpath(snapshot.root)
    patterns = (*DEFAULT_EXCLUDE, SECRETS_FILE, *snapshot.exclude)
    inside = [os.path.relpath(os.path.realpath(folder), root) for folder in runs]
    runs_inside = tuple(folder for folder in inside if folder != "." and not folder.startswith(".."))
    clusterkits: dict[str, str | None] = {}  # folder below root -> what clusterkit wrote it as (None: not)

    def written_by_clusterkit(relative: str) -> bool:
        """Whether ``relative`` or a folder above it (below root) is one clusterkit wrote."""
        parts = PurePosixPath(relative).parts
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            if folder not in clusterkits:
                full = os.path.join(root, folder)
                clusterkits[folder] = _written_by_clusterkit(full) if os.path.isdir(full) else None
            if clusterkits[folder]:
                return True
        return False

    def skipped(relative: str) -> bool:
        return (
            _excluded(relative, patterns)
            or any(relative == folder or relative.startswith(folder + os.sep) for folder in runs_inside)
            or written_by_clusterkit(relative)
        )

    files, left_out, size, untracked = [], [], 0, False
    tracked = set()
    if snapshot.git:
        tracked = {os.fsdecode(name) for name in git(root, "ls-files", "-z", "--cached").stdout.split(b"\0") if name}
    for relative in _candidates(snapshot, skipped):
        relative = relative.rstrip("/")
        if skipped(relative):
            continue
        try:
            size_of, why = _looked_at(os.path.join(root, relative), root)
        except FileNotFoundError:
            continue  # deleted in the work tree: the uncommitted diff removes it
        if why:
            left_out.append(relative + why)
            continue
        files.append(relative)
        size += size_of
        untracked = untracked or (snapshot.git and relative not in tracked)
        if size > snapshot.max_mb * 1_000_000:
            raise UsageError(
                f"snapshot: {snapshot.root} holds more than {snapshot.max_mb} MB (over snapshot.max_mb "
                f"{snapshot.max_mb}): exclude paths (snapshot.exclude), raise max_mb, or submit --no-snapshot"
            )
    # Each outermost folder clusterkit wrote, said once (the folders below it were never looked at).
    left_out += [f"{folder}/ ({what})" for folder, what in sorted(clusterkits.items()) if what]
    commit = dirty = None
    if snapshot.git:
        head = git(root, "rev-parse", "--verify", "-q", "HEAD")
        commit = head.stdout.decode().strip() if head.returncode == 0 else None
        changed = git(root, "diff", "--quiet", "HEAD", "--") if commit else None
        dirty = untracked or commit is None or (changed is not None and changed.returncode != 0)
    return Inventory(
        root=root,
        git=snapshot.git,
        files=tuple(sorted(files)),
        commit=commit,
        dirty=dirty,
        size=size,
        left_out=tuple(left_out),
    )


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
            if info.issym():  # as a relative link, so it points into the copy; checked again (it may have changed)
                target = os.path.realpath(path)
                if os.path.commonpath([target, inventory.root]) == inventory.root:
                    info.linkname = os.path.relpath(target, os.path.dirname(path))
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

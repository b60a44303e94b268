"""Where clusterkit keeps what it can always derive again (the TrainingArguments names it parsed,
compiled templates): ``$XDG_CACHE_HOME/clusterkit``, else ``~/.cache/clusterkit``. Losing it, or
not being able to write it, costs time only.

An entry decides what a later command does (a compiled template is code it runs), so only what
this user alone could have written is read: every folder from ``clusterkit`` down is ours and
writable by no one else (made 0700), the entry a regular file of ours that no one else may write.
A folder that fails this (another user made it first in a shared $XDG_CACHE_HOME, or it is
group-writable) means no cache at all: nothing is read from it or written to it. Folders and
entries are opened once and checked on what was opened (descriptors, no link followed below the
root), so nothing can be swapped between the check and the read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# The largest entry read: more is no entry of ours (a compiled template is tens of KiB).
MAX_ENTRY_BYTES = 16 * 1024 * 1024
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO put in an entry's place returns at once (and is then refused), and
# O_NOCTTY: a terminal device there never becomes ours.
_ENTRY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def user_cache_dir() -> Path | None:
    """None where there is no home to put it in (no HOME and no passwd entry, or a relative HOME)."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(root):  # the XDG spec: a relative path is invalid and ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):  # "~" itself: expanduser found no home
            return None
        root = os.path.join(home, ".cache")
    return Path(root, "clusterkit")


def read_entry(folder: str, name: str) -> bytes | None:
    """The bytes of the entry ``name`` in the cache's ``folder`` ("" for the cache's own), if only
    this user can have written it; else None (missing, unreadable, too large or not private)."""
    folder_fd = _private_folder(folder, create=False)
    if folder_fd is None:
        return None
    try:
        entry_fd = os.open(name, _ENTRY, dir_fd=folder_fd)
    except OSError:  # missing, or a link (O_NOFOLLOW)
        return None
    finally:
        os.close(folder_fd)
    with open(entry_fd, "rb") as entry:
        if not stat.S_ISREG(os.fstat(entry_fd).st_mode) or not _private(entry_fd):
            return None
        try:
            data = entry.read(MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
    return data if len(data) <= MAX_ENTRY_BYTES else None


def write_entry(folder: str, name: str, data: bytes) -> None:
    """Make ``data`` the entry ``name`` in the cache's ``folder`` (made where missing), mode 0600:
    written whole under another name and renamed, so that concurrent readers get the old entry or
    the new one; quietly nothing where the cache cannot be written or is not private."""
    folder_fd = _private_folder(folder, create=True)
    if folder_fd is None:
        return
    temporary = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        entry_fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd
        )
        with open(entry_fd, "wb") as entry:
            entry.write(data)
        os.replace(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException as error:  # nothing half-written stays behind, not even after Ctrl-C
        try:
            os.unlink(temporary, dir_fd=folder_fd)
        except OSError:
            pass
        if not isinstance(error, OSError):  # read-only, full: the next run derives it again
            raise
    finally:
        os.close(folder_fd)


def _private_folder(folder: str, create: bool) -> int | None:
    """A descriptor of the cache's ``folder``, if it and every folder above it up to the cache's
    root are ours and writable by no one else; made (0700) where missing when ``create``."""
    root = user_cache_dir()
    if root is None:
        return None
    # The root may be reached through links (a home or cache moved elsewhere): it is checked as
    # what it leads to. Below it, clusterkit made every folder, and a link is none of its.
    chain = [(str(root), _FOLDER), *((part, _FOLDER | os.O_NOFOLLOW) for part in Path(folder).parts)]
    descriptor = None
    try:
        if create:
            root.parent.mkdir(parents=True, exist_ok=True)
        for name, flags in chain:
            if create:
                try:
                    os.mkdir(name, 0o700, dir_fd=descriptor)
                except FileExistsError:
                    pass
            above, descriptor = descriptor, os.open(name, flags, dir_fd=descriptor)
            if above is not None:
                os.close(above)
            if not _private(descriptor):
                break
        else:
            return descriptor
    except OSError:
        pass
    if descriptor is not None:
        os.close(descriptor)
    return None


def _private(descriptor: int) -> bool:
    """Whether what ``descriptor`` opened is ours and writable by no one else."""
    status = os.fstat(descriptor)
    return status.st_uid == os.geteuid() and not status.st_mode & 0o022

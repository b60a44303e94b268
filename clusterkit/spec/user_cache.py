"""Where clusterkit keeps what it can always derive again (the TrainingArguments names it parsed,
compiled templates, formatted --help, validations): ``$XDG_CACHE_HOME/clusterkit``, else
``~/.cache/clusterkit``. Losing it, or not being able to write it, costs time only."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself costs `clusterkit --help` ~2.5 ms, and the help cache needs this module
if TYPE_CHECKING:
    from pathlib import Path


def user_cache_root() -> str | None:
    """The folder, as a string (no pathlib: ~4 ms of --help); None where there is no home to put
    it in (no HOME and no passwd entry)."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(root):  # the XDG spec: a relative path is invalid and ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):  # "~" itself: expanduser found no home
            return None
        root = os.path.join(home, ".cache")
    return os.path.join(root, "clusterkit")


def user_cache_dir() -> Path | None:
    from pathlib import Path

    root = user_cache_root()
    return None if root is None else Path(root)


def read_private(path: str) -> bytes | None:
    """The bytes of the entry at ``path``, if only this user can have written it; else None (none,
    unreadable, or another's). What is read is printed as is or unmarshalled, and marshal is no
    parser for hostile bytes: an $XDG_CACHE_HOME in a shared folder must not let others choose either."""
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())
            if status.st_uid != os.getuid() or status.st_mode & 0o022:
                return None
            return file.read()
    except OSError:
        return None


def write_private(path: str, data: bytes) -> None:
    """Make ``data`` the entry at ``path``: written whole under another name and renamed, so that
    concurrent readers get the old entry or the new one; quietly nothing where the cache cannot be
    written (read-only, full or missing home)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(descriptor, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException as error:  # nothing half-written stays behind, not even after Ctrl-C
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if not isinstance(error, OSError):
            raise

"""Where clusterkit keeps what it can always derive again (the TrainingArguments names it parsed,
compiled templates): ``$XDG_CACHE_HOME/clusterkit``, else ``~/.cache/clusterkit``. Losing it, or
not being able to write it, costs time only."""

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


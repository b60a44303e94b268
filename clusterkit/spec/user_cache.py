"""Where clusterkit keeps what it can always derive again (the TrainingArguments names it parsed,
compiled templates): ``$XDG_CACHE_HOME/clusterkit``, else ``~/.cache/clusterkit``. Losing it, or
not being able to write it, costs time only."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path | None:
    """None where there is no home to put it in (no HOME and no passwd entry, or a relative HOME)."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(root):  # the XDG spec: a relative path is invalid and ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):  # "~" itself: expanduser found no home
            return None
        root = os.path.join(home, ".cache")
    return Path(root, "clusterkit")

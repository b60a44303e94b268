"""The code snapshot: what a submit copies into the run directory so a queued job runs the code as
it was when it was submitted, not whatever the working tree holds when the job starts."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, field

# A path or a glob, not empty. No pattern: neither reaches a shell (the loader checks the folder is
# one; a glob with a control character simply matches nothing).
_Text = Annotated[str, Meta(min_length=1)]
# Left out of every snapshot, matched against each path component (folders are not entered).
DEFAULT_EXCLUDE = (".git", "__pycache__", "*.pyc")


class Snapshot(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``snapshot:`` as written (``true``/``false`` are short for ``{enabled: ...}``). Default: on for a
    script task whose script is a file on this machine, off for the built-in trainer and a module."""

    enabled: bool = True
    # Copy this directory (relative to the recipe) instead of the script's git repository.
    dir: _Text | None = None
    # More globs left out, matched against each path component and against the whole relative path.
    exclude: list[_Text] = field(default_factory=list)
    # The size guard: a snapshot larger than this is refused rather than copied.
    max_mb: Annotated[int, Meta(ge=1, le=100_000)] = 100


class CodeSnapshot(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The snapshot a submit takes, resolved at load: the folder copied and the script inside it."""

    root: str  # absolute, on the submitting machine: the git work tree, or the folder copied
    script: str  # the script's path relative to root: the job runs <run dir>/code/<script>
    git: bool  # root is a git work tree (its files, not everything on disk), else a folder copy
    exclude: list[str]
    max_mb: int

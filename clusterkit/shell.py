"""Quoting for rendered shell: every interpolated value is quoted unless it is explicitly ``Shell``."""

from __future__ import annotations

import re
import shlex
from typing import Any


class Shell(str):
    """Text that is meant to be shell (setup lines, ``$SLURM_NODEID``): rendered as written."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def quote(value: Any) -> str:
    """Jinja ``finalize`` hook: ``{{ x }}`` is shell-quoted unless ``x`` is :class:`Shell`."""
    if isinstance(value, Shell):
        return value
    if isinstance(value, bool):
        raise TypeError("refusing to render a bool into shell; convert it explicitly")
    return shlex.quote(str(value))


def comment(value: Any) -> Shell:
    """Text safe inside a ``# comment``: control characters (a newline would end it) become spaces."""
    return Shell(_CONTROL.sub(" ", str(value)))

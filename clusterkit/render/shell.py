"""Quoting for rendered shell: every interpolated value is quoted unless it is explicitly ``Shell``."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

from clusterkit.errors import UnsafeValue
from clusterkit.spec.recipe import LINE_BREAKING
from clusterkit.spec.runtime_values import IN_BATCH_SHELL, PLACEHOLDER


class Shell(str):
    """Text that is meant to be shell (setup lines, ``$SLURM_NODEID``): rendered as written."""


_LINE_BREAKING = re.compile(f"[{LINE_BREAKING}]")
_CONTROL = re.compile(f"[{LINE_BREAKING}]+")


def quote(value: Any) -> str:
    """Jinja ``finalize`` hook: ``{{ x }}`` is shell-quoted unless ``x`` is :class:`Shell`."""
    if isinstance(value, Shell):
        return value
    if isinstance(value, bool):
        raise TypeError("refusing to render a bool into shell; convert it explicitly")
    return shlex.quote(str(value))


def join_words(words: Iterable[Any]) -> Shell:
    """An argv list as shell words, each quoted on its own (``[python3, -u]`` → ``python3 -u``)."""
    return Shell(" ".join(quote(word) for word in words))


def one_line(value: Any) -> Any:
    """Refuse a value that would break out of a one-line context such as ``#SBATCH --x=VALUE``.

    The recipe's types already refuse these; this is the renderer's own guard, so a value that
    reached it some other way (a custom template, a new field) still cannot start a shell line."""
    if _LINE_BREAKING.search(str(value)):
        raise UnsafeValue(
            f"refusing to render {str(value)!r} into a one-line context: it holds a line break or control character"
        )
    return value


def comment(value: Any) -> Shell:
    """Text safe inside a ``# comment``: control characters (a newline would end it) become spaces."""
    return Shell(_CONTROL.sub(" ", str(value)))


def runtime_text(text: str) -> Shell:
    """``text`` quoted, with ``{job_id}`` and ``{run_dir}`` as the batch shell's ``"$CLUSTERKIT_JOB_ID"``
    and ``"$RUN_DIR"``; a value known later (``{node_rank}``, ``{master_port}``) stays as quoted text
    for the node agent to fill in (the launch plan names the variables that hold one)."""
    pieces, last = [], 0
    for match in PLACEHOLDER.finditer(text):
        variable = IN_BATCH_SHELL.get(match.group(1))
        if variable is None:
            continue
        if match.start() > last:
            pieces.append(quote(text[last : match.start()]))
        pieces.append(f'"${variable}"')
        last = match.end()
    if last < len(text) or not pieces:
        pieces.append(quote(text[last:]))
    return Shell("".join(pieces))


def extended_value(var: Any) -> Shell:
    """The value of an env edit: ``prepend`` and ``append`` quoted around what the variable holds
    when the line runs, with ``:`` only where both sides are non-empty (the name is a validated
    variable name, so it is safe inside the double quotes)."""
    name = var.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UnsafeValue(f"refusing to render {name!r} as a variable name")
    if var.prepend is not None and var.append is not None:
        middle = f'"${{{name}:+:${name}}}"'
        return Shell(f"{runtime_text(var.prepend)}{middle}{runtime_text(':' + var.append)}")
    if var.prepend is not None:
        return Shell(f'{runtime_text(var.prepend)}"${{{name}:+:${name}}}"')
    return Shell(f'"${{{name}:+${name}:}}"{runtime_text(var.append)}')

"""``clusterkit --help`` and ``clusterkit COMMAND --help`` without building the parser.

Building it (argparse, every command module, typing) costs about twice the interpreter's own start,
so the help argparse formats is kept in the user cache and printed from there while it is fresh.
An entry holds every command's help for one terminal, with what that text is a function of:

- the terminal: what argparse reads for the width (``$COLUMNS``, else the terminal's columns),
  the messages' language (gettext's variables), the Python version and its ``-E`` flag;
- the code: the (path, mtime, size) of every clusterkit module loaded while the parser was built,
  and of argparse's own source. Any of them edited, reinstalled or gone and the entry is stale.

A stale, damaged or unreadable entry (or none, or one another user could have written) means
building the parser as before; that run stores a new entry (written whole and renamed, so
concurrent runs read an old entry or a new one).
Only the two plain forms are answered here; anything else (``-h validate``, ``--help --json``, an
unknown command) is argparse's. Not used on Python 3.14 and later: there argparse colours help by
what stdout is, which an entry formatted once cannot follow.

Imports only what the interpreter has already loaded at start (os, sys, marshal, zlib are built in
or tiny): this module is the whole of a cached ``--help``.
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib

from clusterkit.spec.user_cache import read_private, user_cache_root, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

HELP_FLAGS = ("-h", "--help")
TOP_LEVEL = ""  # the key of `clusterkit --help` among the commands' texts
ENTRY_FORMAT = 1
CACHED = sys.version_info < (3, 14)
_ENVIRONMENT = ("COLUMNS", "LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def help_request(arguments: list[str]) -> str | None:
    """The command whose help ``arguments`` ask for (TOP_LEVEL for ``clusterkit --help``), or None."""
    if len(arguments) == 1 and arguments[0] in HELP_FLAGS:
        return TOP_LEVEL
    if len(arguments) == 2 and arguments[1] in HELP_FLAGS and not arguments[0].startswith("-"):
        return arguments[0]
    return None


def terminal() -> tuple:
    """What argparse's formatting reads of this process's surroundings (see the module's docstring),
    and which install asks (two installs, two venvs, do not take turns overwriting one entry)."""
    try:
        columns: int | None = os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):  # not a terminal, or no stdout at all
        columns = None
    return (ENTRY_FORMAT, __file__, sys.version, sys.flags.ignore_environment, columns,
            tuple(os.environ.get(name) for name in _ENVIRONMENT))


def entry_path(key: tuple) -> str | None:
    root = user_cache_root()
    # The checksum names the file (a terminal of another width has an entry of its own); the key
    # inside the entry is what is compared.
    return None if root is None else os.path.join(root, f"help-{zlib.crc32(repr(key).encode()):08x}")


def cached_help(arguments: list[str]) -> str | None:
    """The help text ``arguments`` ask for, when a fresh entry has it; else None."""
    command = help_request(arguments)
    if command is None or not CACHED or "_ARGCOMPLETE" in os.environ:
        return None
    key = terminal()
    path = entry_path(key)
    if path is None:
        return None
    data = read_private(path)
    if data is None:
        return None
    try:
        entry = marshal.loads(data)
        if entry["key"] != key or not all(_unchanged(*source) for source in entry["sources"]):
            return None
        text = entry["texts"].get(command)
    except (EOFError, ValueError, TypeError, KeyError, AttributeError):  # damaged
        return None
    return text if isinstance(text, str) else None


def _unchanged(path: str, mtime_ns: int, size: int) -> bool:
    try:
        status = os.stat(path)
    except OSError:
        return False
    return status.st_mtime_ns == mtime_ns and status.st_size == size


def store(texts: dict[str, str], sources: Iterable[str]) -> None:
    """Keep ``texts`` (every command's help) for this terminal, as a function of the ``sources``
    files; quietly nothing where the cache cannot be written."""
    if not CACHED or "_ARGCOMPLETE" in os.environ:
        return
    key = terminal()
    path = entry_path(key)
    if path is None:
        return
    try:
        stats = [(source, os.stat(source)) for source in sorted(set(sources))]
    except OSError:  # a source gone already: the next --help builds the parser again
        return
    write_private(path, marshal.dumps({"key": key, "texts": texts,
                                       "sources": [(source, s.st_mtime_ns, s.st_size) for source, s in stats]}))


def loaded_sources() -> list[str]:
    """The source files of the loaded clusterkit modules and of argparse (a namespace package has
    none, nor code; a file that cannot be stat'ed, as in a zip import, means storing nothing)."""
    names = [name for name in sys.modules if name == "clusterkit" or name.startswith("clusterkit.")] + ["argparse"]
    return [path for path in (getattr(sys.modules[name], "__file__", None) for name in names) if path]

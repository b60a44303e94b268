"""Every error clusterkit reports, in two kinds the CLI maps to exit codes in one place:
:class:`UserError` (exit 2: the input, an argument or a path the user gave is wrong; fix it and run
again) and :class:`ExternalError` (exit 1: the scheduler, the login node or this machine failed).

Each message is one line of inert text; a recipe problem points at a file, a line and a key path.
Several classes also derive from the builtin they replaced (``LookupError``, ``RuntimeError``,
``ValueError``) so that code catching the builtin keeps working.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass


def printable(text: str) -> str:
    """One line of inert text: line breaks, escape sequences (ESC, BEL) and every other control or
    separator character from a recipe are shown escaped (``\\n``, ``\\x1b``), never sent to the
    terminal or log as they are."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


@dataclass(frozen=True)
class Location:
    """Where a value came from: a file and line, or a command-line override."""

    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


def format_key_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


@dataclass(frozen=True)
class Finding:
    """One problem found in a recipe. ``severity`` is "error" or "warning"."""

    location: Location
    key_path: tuple[str | int, ...]
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        prefix = "" if self.severity == "error" else "warning: "
        return printable(f"{self.location}: {prefix}{format_key_path(self.key_path)}: {self.message}")


class ClusterkitError(Exception):
    """An error for the user to read: ``str()`` is one line, its kind the exit code."""

    def __str__(self) -> str:
        return printable(super().__str__())


class UserError(ClusterkitError):
    """The user's input, arguments or chosen paths are wrong: exit 2, nothing written or queued."""


class ExternalError(ClusterkitError):
    """The scheduler, the login node or this machine failed what was asked of it: exit 1."""


class LocatedError(UserError):
    """A problem in a file the user gave, said as compilers say it (``FILE[:LINE]: ...``): the CLI
    prints it as it is, with no ``clusterkit:`` before it."""


class RecipeError(LocatedError):
    """Bad user input. The CLI prints ``str(error)`` (one line) and exits with code 2."""

    def __init__(self, finding: Finding):
        super().__init__(str(finding))
        self.finding = finding

    def __str__(self) -> str:
        return Exception.__str__(self)  # already printable, one line per finding


class RecipeErrors(RecipeError):
    """Several independent problems in one recipe, reported together (one line each)."""

    def __init__(self, findings: list[Finding]):
        Exception.__init__(self, "\n".join(str(f) for f in findings))
        self.finding = findings[0]
        self.findings = findings


class UsageError(UserError):
    """Command-line arguments that do not go together or do not fit the run (a rank not in it)."""


class RunNotFound(UserError, LookupError):
    """No run with that job id or run directory."""


class BadRunRecord(UserError, LookupError):
    """A run.json or uploaded bundle that is not one (truncated, edited, not ours), named with what is wrong."""


class OutputDirError(UserError):
    """The output folder cannot take what a command writes (``render -o``, ``export -o``): not empty and
    not an earlier output of that command; the message is one line naming it."""


class UnsafeValue(UserError, ValueError):
    """A value that cannot be rendered where a template put it (a line break in an #SBATCH line)."""


class TemplateError(LocatedError):
    """A job template (an ops one: --template-dir, $CLUSTERKIT_TEMPLATES, the recipe's folder) that
    cannot be read or rendered, or a template directory that is not one: ``file[:line]: template: ...``."""


class PathError(UserError, LookupError):
    """A path the user chose cannot be used: a file in the way, no permission, a name too long."""


class SubmitError(ExternalError, RuntimeError):
    """The scheduler refused the job (distinct from a job that was accepted and then failed)."""


class SchedulerError(ExternalError, RuntimeError):
    """A scheduler command (squeue, scontrol, scancel) failed or did not answer; the message holds its stderr."""


class FunctionFailed(ExternalError, RuntimeError):
    """A function's job (clusterkit.submit_function) raised, or ended without a result. ``str()`` is
    one line (the exception's own); ``.remote_traceback`` is the job's traceback and ``.log_tail`` the
    task's last log lines, also added as notes, which Python prints under the error (line by line,
    each line inert: a log's escape sequences are shown escaped)."""

    def __init__(self, message: str, remote_traceback: str = "", log_tail: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback
        self.log_tail = log_tail
        for note in (remote_traceback, log_tail):
            if note and hasattr(self, "add_note"):  # Python 3.11+
                self.add_note("\n".join(printable(line) for line in note.rstrip("\n").splitlines()))


class WaitTimeout(ExternalError, TimeoutError):
    """A run did not end within the time a caller waited for it (the run itself goes on)."""


class SSHError(ExternalError, RuntimeError):
    """Connecting or running a command on the login node failed; the message says what to do."""


class MissingPackage(ExternalError):
    """This machine lacks a Python package the command needs (torch on a login node); the message
    says what to install."""


class FileSystemError(ExternalError, RuntimeError):
    """This machine's file system failed a write (a full disk, an I/O error, a quota)."""


# Errors of the path the user chose; any other (ENOSPC, EIO, EDQUOT) is the machine's.
_PATH_ERRNOS = frozenset(
    {
        errno.ENOTDIR,
        errno.EEXIST,
        errno.EISDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ENAMETOOLONG,
        errno.EROFS,
        errno.ELOOP,
        errno.ENOENT,
    }
)


def is_users_path_error(exc: OSError) -> bool:
    """Whether an ``OSError`` is about the path the user gave (exit 2) rather than the machine (exit 1)."""
    return exc.errno in _PATH_ERRNOS

"""The values of a recipe's ``secrets:`` and how they reach the ranks without being written anywhere
else.

Where values come from: the submitting environment first (as bytes, exactly: quotes, newlines,
``$(...)``, a trailing backslash and non-UTF-8 bytes pass unchanged), else the user config's
``secrets_file``: ``NAME=value`` lines, the value the rest of the line as written (bytes as they
are, a CRLF line's carriage return dropped; ``#`` lines and blank lines skipped); the file must be
its owner's and readable by its owner only. No value can hold a NUL (no environment string can). A
secret in neither, or empty, stops the submit before anything is written or queued.

How they reach the ranks: the submitting adapter writes them, NUL-separated (``NAME=value\\0``),
into :data:`~clusterkit.spec.layout.SECRETS_FILE` in the staging directory, created with mode 0600
and O_EXCL (over SSH: under ``umask 077`` with ``set -C``, the values on the command's standard
input, never in its command line); the rename makes it part of the run directory, still readable by
its owner only. The batch script reads it into its environment with ``read -d ''`` and ``export``
(no ``eval``, no echo), and srun (or the local executor's stand-in) passes that environment to every
rank. Not ``sbatch --export``: SLURM would keep the values in its spool and, with
``AccountingStoreFlags=job_env``, in the accounting database, and the local executor has no sbatch;
sbatch runs as ``env -u NAME ... sbatch`` for the same reason.

Why a file that stays: every later attempt of the run starts from the same script in the same run
directory and needs the values again (a requeue after preemption, an automatic retry, a chain's
next link, an array's other tasks). The job's supervisor removes a single job's file when its end is
the run's end (clusterkit.supervisor.batch): the job ended and neither a requeue (its own, or one a
program asked for and marked with :data:`~clusterkit.spec.layout.REQUEUED`) nor a retry will start it
again; never when SLURM kills it (its own requeue). Until the supervisor runs, the batch script
removes it if a line before fails. ``clusterkit cancel`` removes it too. Otherwise (an array's, a
chain's) it stays, mode 0600, like ``~/.cache/huggingface/token``: an interrupted submit (Ctrl-C,
kill -9) leaves it no more readable.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

from clusterkit.errors import UserError
from clusterkit.spec.bounded_read import CONFIG_LIMIT, read_bounded

# Linux refuses to start a program with one environment string longer than this (MAX_ARG_STRLEN).
MAX_ENV_STRING = 128 * 1024
_LINE = re.compile(rb"([A-Za-z_][A-Za-z0-9_]*)=(.*)")


class SecretError(UserError):
    """A secret that cannot be sent; the message names it, never its value."""


def secrets_payload(names: Sequence[str]) -> bytes:
    """``NAME=value\\0`` for each secret, from the environment or the user's secrets file."""
    if not names:
        return b""
    from_file: dict[bytes, tuple[bytes, str]] = {}
    missing = [name for name in names if os.environb.get(name.encode()) is None]
    if missing:
        from_file = _read_secrets_file(missing)
    payload = []
    for name in names:
        value = os.environb.get(name.encode())
        where = "in the environment"
        if value is None and name.encode() in from_file:
            value, where = from_file[name.encode()]
        if value is None:
            raise SecretError(
                f"secret {name} is not set: export it in the environment you submit from, "
                f"or add it to the secrets_file your user config names"
            )
        if not value:
            raise SecretError(f"secret {name} is empty {where}")
        if len(name) + len(value) + 2 > MAX_ENV_STRING:
            raise SecretError(
                f"secret {name} {where} is longer than the {MAX_ENV_STRING} bytes Linux allows one environment variable"
            )
        payload.append(name.encode() + b"=" + value + b"\0")
    return b"".join(payload)


def _read_secrets_file(names: Sequence[str]) -> dict[bytes, tuple[bytes, str]]:
    """The user config's secrets_file, name -> (value, where): refused when anyone but its owner may
    read it. Errors say the file and line, never a value."""
    from clusterkit.load.user_config import load_user_config

    config = load_user_config()
    path = config.secrets_path()
    if path is None:
        return {}

    def private(info: os.stat_result) -> None:
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretError(
                f"{path}: secrets_file must be yours and readable by you only "
                f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 600 {path}"
            )

    try:
        data = read_bounded(path, CONFIG_LIMIT, "the secrets_file", check=private)
    except OSError as exc:
        raise SecretError(
            f"{path}: cannot read the secrets_file ({config.location(('secrets_file',))} names it): "
            f"{exc.strerror or exc}"
        ) from None
    values: dict[bytes, tuple[bytes, str]] = {}
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip() or line.lstrip().startswith(b"#"):
            continue
        found = _LINE.fullmatch(line.removesuffix(b"\r"))
        if found is None or b"\0" in line:
            raise SecretError(f"{path}:{number}: not a NAME=value line (the value is the rest of the line, as written)")
        if found.group(1) in values:
            raise SecretError(f"{path}:{number}: {found.group(1).decode()} is set twice")
        values[found.group(1)] = (found.group(2), f"in {path}:{number}")
    return values


def write_private(path: str, data: bytes) -> None:
    """Create ``path`` readable and writable by its owner only, from the first instant (O_EXCL: a
    file already there, or a link planted in its place, is an error, never written through)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
    finally:
        os.close(fd)

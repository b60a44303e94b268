"""Where scheduler commands run and run files live: this machine, or a login node over SSH.

The SLURM adapter is written against :class:`Host` only, so submitting on this machine and on a
login node is one code path; :class:`LocalHost` is this machine, ``ssh.SSHHost`` the login node.
Paths are POSIX strings; a relative one is taken from the host's working directory (the login
node's ``remote_workdir``; here, the current directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from clusterkit.errors import SchedulerError
from clusterkit.schedulers.code_snapshot import unpack
from clusterkit.schedulers.secret_values import write_private


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class Host(Protocol):
    name: str  # for messages: "this machine" or the login node's host name

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        """Run one command (no shell); a missing program or no answer in time is a SchedulerError."""

    def attach(self, argv: Sequence[str], tty: bool = False) -> int:
        """Run one command (no shell) with this terminal's input and output, for as long as it runs;
        its exit status. ``tty``: it gets a terminal of its own there (an interactive shell)."""

    def absolute(self, path: str) -> str: ...

    def make_dirs(self, path: str) -> None: ...

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Create ``path`` with ``text`` (UTF-8), replacing it whole if it exists."""

    def write_private(self, path: str, data: bytes) -> None:
        """Create ``path`` (not there yet) readable by its owner only from the first instant, ``data``
        never on a command line."""

    def rename(self, source: str, target: str) -> None: ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory and what is in it; nothing if it is not there. Never raises."""

    def upload(self, local_path: str, path: str) -> None:
        """Copy a file of this machine to ``path`` (nothing to do where both are this machine)."""

    def unpack(self, tar: bytes, path: str) -> None:
        """Unpack a tar (a code snapshot) into the folder ``path``, created, file modes kept."""

    def open(self, path: str) -> IO[bytes]: ...

    def listdir(self, path: str) -> list[str]: ...


class LocalHost:
    name = "this machine"

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]}: command not found") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{' '.join(argv)}: no answer within {timeout:.0f} s") from None
        return Completed(done.returncode, done.stdout, done.stderr)

    def attach(self, argv: Sequence[str], tty: bool = False) -> int:
        return attached(argv)  # this terminal is already the command's: srun --pty reads and writes it

    def absolute(self, path: str) -> str:
        return str(Path(path).absolute())

    def make_dirs(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        # A staging name then a rename: a reader (or a crash) never sees half a file.
        staging = Path(f"{path}.tmp")
        staging.write_text(text, encoding="utf-8")
        staging.chmod(mode)
        os.replace(staging, path)

    def write_private(self, path: str, data: bytes) -> None:
        write_private(path, data)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def upload(self, local_path: str, path: str) -> None:
        if Path(local_path).absolute() != Path(path).absolute():
            shutil.copyfile(local_path, path)

    def unpack(self, tar: bytes, path: str) -> None:
        unpack(tar, path)

    def open(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


def attached(argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one command (no shell) here with this terminal's input and output; its exit status as a
    shell reports it (killed by signal N: 128+N). Ctrl-C is the command's, as in a shell: it reaches
    it from the terminal, and this process waits for it to end (srun, on a first Ctrl-C, reports its
    tasks and goes on; a second ends them) instead of killing it from under them."""
    try:
        process = subprocess.Popen(list(argv), cwd=cwd, env=env)
    except FileNotFoundError:
        raise SchedulerError(f"{argv[0]}: command not found") from None
    main = threading.current_thread() is threading.main_thread()  # the only one that may set handlers
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # once started: the command's
    try:
        code = process.wait()
    finally:
        if main:
            signal.signal(signal.SIGINT, before)
    return code if code >= 0 else 128 - code


def without_env(names: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` run with these variables unset: SLURM's clients take formats, filters and sorts from
    the environment (a user's SQUEUE_FORMAT, SINFO_PARTITION, SACCT_FORMAT), which would change the
    lines clusterkit reads."""
    return ["env", *(word for name in names for word in ("-u", name)), *argv]


def checked(host: Host, argv: Sequence[str], timeout: float = 30.0) -> str:
    """``host.run`` that turns a failing command into one SchedulerError naming it and its error."""
    done = host.run(argv, timeout)
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
        where = "" if isinstance(host, LocalHost) else f"on {host.name}: "
        raise SchedulerError(
            f"{where}{' '.join(argv)} failed ({done.returncode}): {detail[-1] if detail else 'no output'}"
        )
    return done.stdout

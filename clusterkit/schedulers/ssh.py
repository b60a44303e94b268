"""The SSH adapter: the SLURM adapter with the cluster's login node as its host.

A laptop submits exactly what a login node would: the same request, the same argv, the same steps
(:mod:`clusterkit.schedulers.slurm`), each one a quoted command over the SSH session (files too:
cat, mv, find), whichever transport (:mod:`clusterkit.schedulers.ssh_transport`) carries it. The
batch script is byte for byte the one ``submit --dry-run`` printed. A local ``run.json`` (scheduler
``ssh``) remembers where the run lives, so ``status``, ``logs``, ``cancel`` and ``ls`` reach it again.
Where the login node has clusterkit, status and logs ask it (it reads the run directory there: the
first failing rank, one rank's log); without it, SLURM and the files themselves answer.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import io
import json
import os
import posixpath
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, BinaryIO, TypeVar

import msgspec

from clusterkit.errors import SSHError
from clusterkit.load.user_config import load_user_config
from clusterkit.runs.index import add_run
from clusterkit.runs.logs import stream
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import UNKNOWN, JobStatus
from clusterkit.schedulers.api import SubmitRequest
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.schedulers.ssh_transport import READ_ONLY_ATTEMPTS, Session, Unreachable, command_line, connect
from clusterkit.spec.layout import STREAMS, node_log
from clusterkit.spec.profile import Login

# SLURM on the login node runs every job clusterkit renders (schedulers.api.check_capabilities).
UNSUPPORTED: dict[str, str] = {}
MAX_NODES = None

T = TypeVar("T")
# The exit status of a file command whose file is not there (cat and find would say so in words).
MISSING = 66


class RemoteFile:
    """A file on the login node with the one method readers here use: ``open("rb")``."""

    def __init__(self, host: SSHHost, path: str):
        self.host, self.path = host, path

    def open(self, mode: str = "rb") -> IO[bytes]:
        return self.host.open(self.path)

    def __str__(self) -> str:
        return self.path


class SSHHost:
    """The login node as a :class:`~clusterkit.schedulers.host.Host`: commands run in
    ``remote_workdir``, relative paths are taken from there. Files are read, written and listed by
    shell commands over the session (cat, mv, find), so any transport that runs a command serves."""

    def __init__(self, session: Session, login: Login):
        self.session, self.login = session, login
        self.name = session.endpoint.host

    @functools.cached_property
    def workdir(self) -> str:
        """remote_workdir, created if missing, as an absolute path (``~`` is the session's start)."""
        workdir = self.login.remote_workdir
        workdir = "." if workdir == "~" else workdir.removeprefix("~/")
        return self.session.check(
            command_line(["mkdir", "-p", "--", workdir]) + " && " + command_line(["pwd", "-P"], cwd=workdir)
        ).strip()

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        return self.session.run(command_line(argv, cwd=self.workdir), timeout=timeout)

    def attach(self, argv: Sequence[str], tty: bool = False) -> int:
        return self.session.attach(command_line(argv, cwd=self.workdir), tty)

    def absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def make_dirs(self, path: str) -> None:
        self.session.check(command_line(["mkdir", "-p", "--", self.absolute(path)]))

    def _write(self, target: str, data: bytes, mode: int) -> None:
        # A staging name then a rename: a reader (or a dropped connection) never sees half a file.
        staging = shlex.quote(f"{target}.tmp")
        self.session.check(
            f"cat > {staging} && chmod {mode:o} {staging} && mv -fT {staging} {shlex.quote(target)}", stdin=data
        )

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        self._write(self.absolute(path), text.encode("utf-8"), mode)

    def write_private(self, path: str, data: bytes) -> None:
        # umask 077: created 0600, never readable by others even for an instant; set -C: O_EXCL.
        # The data is the command's standard input, never a word of its command line.
        self.session.check(f"umask 077 && set -C && cat > {shlex.quote(self.absolute(path))}", stdin=data)

    def rename(self, source: str, target: str) -> None:
        # -T: onto an existing directory is an error, never a move into it.
        self.session.check(command_line(["mv", "-T", "--", self.absolute(source), self.absolute(target)]))

    def remove_tree(self, path: str) -> None:
        try:
            self.session.run(command_line(["rm", "-rf", "--", self.absolute(path)]))
        except SSHError:
            pass  # the connection is gone: the error that brought us here is the one to report

    def upload(self, local_path: str, path: str) -> None:
        target = self.absolute(path)
        self.make_dirs(posixpath.dirname(target))
        self._write(target, Path(local_path).read_bytes(), os.stat(local_path).st_mode & 0o777)

    def unpack(self, tar: bytes, path: str) -> None:
        # The tar through the session to the login node's tar: one command, however many files; as
        # long as a snapshot of up to max_mb may take to cross a slow link.
        target = self.absolute(path)
        self.session.check(
            command_line(["mkdir", "-p", "--", target])
            + " && "
            + command_line(["tar", "-x", "-p", "-f", "-", "-C", target]),
            timeout=900,
            stdin=tar,
        )

    def _bytes(self, path: str, test: str, command: str) -> bytes:
        """``command``'s raw output, for a ``path`` that passes ``test -<test>`` (else FileNotFoundError)."""
        quoted = shlex.quote(path)
        out, err = io.BytesIO(), io.BytesIO()
        done = self.session.run(f"[ -{test} {quoted} ] || exit {MISSING}; {command}", stdout=out, stderr=err)
        if done.returncode == MISSING:
            raise FileNotFoundError(errno.ENOENT, f"no such file on {self.name}", path)
        if done.returncode != 0:
            detail = err.getvalue().decode("utf-8", "replace").strip().splitlines()
            raise SSHError(f"on {self.name}: reading {path} failed: {detail[-1] if detail else done.returncode}")
        return out.getvalue()

    def open(self, path: str) -> IO[bytes]:
        target = shlex.quote(self.absolute(path))
        return io.BytesIO(self._bytes(self.absolute(path), "f", f"exec cat -- {target}"))

    def listdir(self, path: str) -> list[str]:
        target = self.absolute(path)
        listing = self._bytes(
            target, "d", f"cd -- {shlex.quote(target)} && find . -mindepth 1 -maxdepth 1 -exec printf '%s\\0' {{}} +"
        )
        return [os.fsdecode(name).removeprefix("./") for name in listing.split(b"\0") if name]

    @functools.cached_property
    def has_clusterkit(self) -> bool:
        return self.run([self.login.python, "-c", "import clusterkit"]).returncode == 0

    def clusterkit(self, *args: str) -> list[str]:
        return [self.login.python, "-m", "clusterkit", *args]


class SSHScheduler(SlurmScheduler):
    """SLURM on the login node; the run's record is kept here as well."""

    def __init__(self, login: Login, accept_new_host_key: bool = False):
        self.login, self.accept_new_host_key = login, accept_new_host_key
        self._session: Session | None = None
        self._host: SSHHost | None = None

    @property
    def host(self) -> SSHHost:  # type: ignore[override]  # connected on first use
        return self._connected()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    def _read(self, action: Callable[[SSHHost], T]) -> T:
        """A read-only ``action``, retried on a fresh connection when this one drops. Submission
        and cancel never go through here: a retried submit could queue the job twice."""
        for attempt in range(1, READ_ONLY_ATTEMPTS):
            try:
                return action(self._connected())
            except Unreachable:
                self.close()
                self._session = self._host = None
                time.sleep(attempt)
        return action(self._connected())

    def _connected(self) -> SSHHost:
        if self._session is None or self._host is None:
            self._session = connect(self.login, self.accept_new_host_key)
            self._host = SSHHost(self._session, self.login)
        return self._host

    def submit(self, request: SubmitRequest) -> RunRecord:
        self._connected()
        on_cluster = super().submit(request)
        record = remote_record(on_cluster, self.login)
        local_dir = local_record_dir(request, record.job_id)
        local_dir.mkdir(parents=True, exist_ok=True)
        record.write(local_dir)
        add_run(record, local_dir)
        return record

    def statuses(self, records: list[RunRecord]) -> list[JobStatus]:
        """One squeue on the login node for all the runs; a run that ended (or that SLURM has
        forgotten) is then asked of the login node's clusterkit where it has one: it reads the run
        directory there (the first failing rank, a preemption)."""

        def ask(host: SSHHost) -> list[JobStatus]:
            found = SlurmScheduler.statuses(self, records)
            return [self._explained(host, record, status) for record, status in zip(records, found)]

        return self._read(ask)

    @staticmethod
    def _explained(host: SSHHost, record: RunRecord, status: JobStatus) -> JobStatus:
        if (status.done or status.state == UNKNOWN) and not (record.tasks or record.links) and host.has_clusterkit:
            done = host.run(host.clusterkit("status", "--json", record.run_dir))
            if done.returncode == 0:
                return JobStatus(**json.loads(done.stdout))
        return status

    def cancel(self, record: RunRecord) -> None:
        self._connected()
        super().cancel(record)

    def ask_stacks(self, record: RunRecord) -> None:
        self._connected()
        super().ask_stacks(record)

    def logs(self, record: RunRecord, rank: int | None, follow: bool, out: BinaryIO | None = None) -> int:
        """The run's logs printed here, as they grow with ``follow`` (not retried then: output would repeat)."""
        host = self._connected()
        if host.has_clusterkit:
            args = [
                "logs",
                record.run_dir,
                *(["--rank", str(rank)] if rank is not None else []),
                *(["-f"] if follow else []),
            ]

            def run(on: SSHHost) -> int:
                return on.session.run(
                    command_line(on.clusterkit(*args), cwd=on.workdir),
                    timeout=7 * 24 * 3600,
                    stdout=out or sys.stdout.buffer,
                    stderr=sys.stderr.buffer,
                ).returncode

            return run(host) if follow else self._read(run)
        if rank is not None:
            raise SSHError(
                f"logs --rank needs clusterkit on {host.name} (login.python in the "
                f"cluster profile names the interpreter it is installed in)"
            )

        def node_logs() -> list[RemoteFile]:
            names = host.listdir(record.run_dir)
            return [
                RemoteFile(host, f"{record.run_dir}/{name}")
                for stream_name in STREAMS
                for name in sorted(names)
                if fnmatch.fnmatchcase(name, node_log(record.job_id, "*", stream_name))
            ]

        return stream(node_logs, lambda: self.status(record).done, follow, base=record.run_dir, out=out)

    def run_file(self, record: RunRecord, name: str) -> RemoteFile:
        return RemoteFile(self._connected(), f"{record.run_dir}/{name}")

    def list_runs(self, runs_dir: str, limit: int, as_json: bool = False) -> int:
        """``ls --cluster``: the runs on the cluster itself, as its own clusterkit lists them."""

        def remote_ls(host: SSHHost) -> int:
            if not host.has_clusterkit:
                raise SSHError(
                    f"ls --cluster needs clusterkit on {host.name} (login.python names its interpreter); "
                    f"`clusterkit ls` lists the runs submitted from this machine"
                )
            ls = host.clusterkit("ls", "--runs-dir", runs_dir, "--limit", str(limit), *(["--json"] if as_json else []))
            return host.session.run(
                command_line(ls, cwd=host.workdir), stdout=sys.stdout.buffer, stderr=sys.stderr.buffer
            ).returncode

        return self._read(remote_ls)


def remote_record(record: RunRecord, login: Login) -> RunRecord:
    """The local record of a run submitted over SSH."""
    return replace(record, scheduler="ssh", login=msgspec.to_builtins(login))


def local_record_dir(request: SubmitRequest, job_id: str) -> Path:
    """Where this machine keeps an ssh run's record: runs_dir (when relative, else ./runs) here,
    ``<name>/<job id>@<host>``, so ``clusterkit status JOB`` finds it as it finds local runs."""
    assert request.login is not None
    runs_dir = Path(request.runs_dir).expanduser()
    return (Path("runs") if runs_dir.is_absolute() else runs_dir) / request.name / f"{job_id}@{request.login.host}"


@contextlib.contextmanager
def open_scheduler(login: Login | None, accept_new_host_key: bool = False) -> Iterator[SSHScheduler]:
    if login is None:
        raise SSHError("an ssh run names no login node")
    # The user config's ssh: (this machine's choice of transport) wins over the profile's login:,
    # for the submit and for every later status, logs or cancel of the run alike.
    login = msgspec.structs.replace(login, **load_user_config().ssh_settings())
    scheduler = SSHScheduler(login, accept_new_host_key)
    try:
        yield scheduler
    finally:
        scheduler.close()

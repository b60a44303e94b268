"""The SSH adapter: the dry run's request, submitted on the cluster's login node from a laptop.

The run bundle (the rendered files and ``bundle.json``) is uploaded over SFTP beside where the run
directory will be. With clusterkit installed on the login node, ``clusterkit submit --bundle`` runs
there and does exactly what a local submit does; without it, ``sbatch --hold`` takes the rendered
script, the bundle becomes the run directory and ``scontrol release`` starts the job. Either way the
batch script is byte for byte the one ``submit --dry-run`` printed. A local ``run.json`` (scheduler
``ssh``) remembers where the run lives, so ``status``, ``logs``, ``cancel`` and ``ls`` reach it again.
"""

from __future__ import annotations

import fnmatch
import functools
import io
import json
import posixpath
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import IO, Annotated, Any

import msgspec

from clusterkit.errors import BadRunRecord
from clusterkit.runs.status import UNKNOWN, JobStatus, scontrol_show_job, slurm_status
from clusterkit.spec.profile import Login
from clusterkit.runs.layout import BUNDLE_FILE, EXIT_CODE, JOB_SCRIPT, RUN_RECORD, STREAMS, UPLOAD_PREFIX, node_log
from clusterkit.runs.record import RunRecord, parse_record
from clusterkit.schedulers.ssh_transport import SSHError, SSHSession, command_line, connect, read_only
from clusterkit.schedulers.api import SubmitRequest

BUNDLE_FORMAT = 1


def bundle_json(request: SubmitRequest) -> str:
    """What the login node's clusterkit needs besides the rendered files to rebuild the request."""
    return json.dumps({
        "format": BUNDLE_FORMAT, "name": request.name, "recipe": request.recipe, "runs_dir": request.runs_dir,
        "nodes": request.nodes, "ranks_per_node": request.ranks_per_node, "launcher": request.launcher,
        "overrides": list(request.overrides), "files": sorted(request.files),
    }, indent=2) + "\n"


class Bundle(msgspec.Struct):
    """bundle.json, as :func:`bundle_json` writes it."""

    format: int
    name: str
    recipe: str
    runs_dir: str
    nodes: Annotated[int, msgspec.Meta(ge=1)]
    ranks_per_node: Annotated[int, msgspec.Meta(ge=1)]
    launcher: str
    overrides: list[str]
    files: list[str]


class BadBundle(BadRunRecord):
    """An uploaded bundle that cannot be submitted (damaged, incomplete, another version's)."""


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def request_from_bundle(bundle_dir: Path) -> SubmitRequest:
    """On the login node: the SLURM request for a bundle a remote clusterkit uploaded."""
    try:
        meta = msgspec.json.decode((bundle_dir / BUNDLE_FILE).read_bytes(), type=Bundle)
    except OSError as exc:
        raise BadBundle(f"{bundle_dir / BUNDLE_FILE}: cannot read the bundle: {exc.strerror}") from None
    except msgspec.DecodeError as exc:
        raise BadBundle(f"{bundle_dir / BUNDLE_FILE}: not a clusterkit bundle: {exc}") from None
    if meta.format != BUNDLE_FORMAT:
        raise BadBundle(f"{bundle_dir}: bundle format {meta.format} is not {BUNDLE_FORMAT}; "
                        f"install the same clusterkit version on both machines")
    if JOB_SCRIPT not in meta.files or not all(_plain_name(name) for name in [*meta.files, meta.name]):
        raise BadBundle(f"{bundle_dir / BUNDLE_FILE}: files must be plain file names including {JOB_SCRIPT}, "
                        f"and name a plain name")
    try:
        files = {name: (bundle_dir / name).read_text(encoding="utf-8") for name in meta.files}
    except OSError as exc:
        raise BadBundle(f"{exc.filename}: cannot read the bundle file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadBundle(f"{bundle_dir}: a bundle file is not UTF-8 text") from None
    return SubmitRequest(
        scheduler="slurm", name=meta.name, recipe=meta.recipe,
        runs_root=Path(meta.runs_dir).expanduser().absolute() / meta.name,
        script=files[JOB_SCRIPT], files=files, nodes=meta.nodes, ranks_per_node=meta.ranks_per_node,
        launcher=meta.launcher, overrides=tuple(meta.overrides), runs_dir=meta.runs_dir,
    )


class RemoteFile:
    """A file on the login node with the one method readers here use: ``open("rb")``."""

    def __init__(self, session: SSHSession, path: str):
        self.session, self.path = session, path

    def open(self, mode: str = "rb") -> IO[bytes]:
        return self.session.sftp.open(self.path, mode)  # ENOENT arrives as FileNotFoundError

    def __str__(self) -> str:
        return self.path

    def read_text(self) -> str:
        with self.open() as handle:
            return handle.read().decode("utf-8", "replace")


class LoginNode:
    """The cluster as seen through one SSH session."""

    def __init__(self, session: SSHSession, login: Login):
        self.session, self.login = session, login

    @functools.cached_property
    def workdir(self) -> str:
        """remote_workdir, created if missing, as an absolute path (``~`` is the session's start)."""
        workdir = self.login.remote_workdir
        workdir = "." if workdir == "~" else workdir.removeprefix("~/")
        return self.session.check(command_line(["mkdir", "-p", "--", workdir]) + " && "
                                  + command_line(["pwd", "-P"], cwd=workdir)).strip()

    @functools.cached_property
    def has_clusterkit(self) -> bool:
        return self.session.run(command_line([self.login.python, "-c", "import clusterkit"], cwd=self.workdir)).returncode == 0

    def clusterkit(self, *args: str) -> str:
        return command_line([self.login.python, "-m", "clusterkit", *args], cwd=self.workdir)

    def upload(self, request: SubmitRequest, bundle_dir: str) -> None:
        sftp = self.session.sftp
        self.session.check(command_line(["mkdir", "-p", "--", bundle_dir]))
        for name, text in {**request.files, BUNDLE_FILE: bundle_json(request)}.items():
            sftp.putfo(io.BytesIO(text.encode("utf-8")), f"{bundle_dir}/{name}")
        sftp.chmod(f"{bundle_dir}/{JOB_SCRIPT}", 0o755)
        for script in request.uploads:
            target = posixpath.join(self.workdir, script)
            self.session.check(command_line(["mkdir", "-p", "--", posixpath.dirname(target)]))
            sftp.put(script, target)

    def submit(self, request: SubmitRequest) -> RunRecord:
        """Upload and submit; returns the record as the login node wrote it."""
        runs_root = posixpath.join(self.workdir, str(request.runs_root))
        bundle_dir = f"{runs_root}/{UPLOAD_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            self.upload(request, bundle_dir)
            if self.has_clusterkit:
                output = self.session.check(self.clusterkit("submit", "--bundle", bundle_dir), timeout=300)
                return parse_record(output.strip().splitlines()[-1])
            return self._sbatch(request, runs_root, bundle_dir)
        except BaseException:
            try:
                self.session.run(command_line(["rm", "-rf", "--", bundle_dir]))
            except SSHError:
                pass  # the connection is gone: the first error is the one to report
            raise

    def _sbatch(self, request: SubmitRequest, runs_root: str, bundle_dir: str) -> RunRecord:
        """No clusterkit on the login node: the same steps as the SLURM adapter, as shell commands."""
        output = self.session.check(command_line(["sbatch", "--parsable", "--hold", f"{bundle_dir}/{JOB_SCRIPT}"],
                                                 cwd=self.workdir), timeout=300)
        job_id = output.strip().split(";")[0]
        if not job_id.isdigit():
            raise SSHError(f"on {self.session.endpoint.host}: sbatch answered {output.strip()!r}, not a job id")
        try:
            run_dir = f"{runs_root}/{job_id}"
            self.session.sftp.rename(bundle_dir, run_dir)
            self.session.sftp.remove(f"{run_dir}/{BUNDLE_FILE}")
            record = RunRecord(
                job_id=job_id, name=request.name, scheduler="slurm", run_dir=run_dir, recipe=request.recipe,
                submitted_at=time.time(), nodes=request.nodes, ranks_per_node=request.ranks_per_node,
                launcher=request.launcher, overrides=request.overrides,
            )
            self.session.sftp.putfo(io.BytesIO(record.to_json().encode()), f"{run_dir}/{RUN_RECORD}")
            self.session.check(command_line(["scontrol", "release", job_id]))
        except BaseException:
            self.session.run(command_line(["scancel", job_id]))  # never leave a half-prepared job queued
            raise
        return record

    def status(self, record: RunRecord) -> JobStatus:
        if self.has_clusterkit:
            done = self.session.run(self.clusterkit("status", "--json", record.run_dir))
            if done.returncode == 0:
                return JobStatus(**json.loads(done.stdout))
        done = self.session.run(command_line(scontrol_show_job(record.job_id)))
        try:
            exit_code: int | None = int(RemoteFile(self.session, f"{record.run_dir}/{EXIT_CODE}").read_text())
        except (OSError, ValueError):
            exit_code = None
        return slurm_status(done.returncode, done.stdout, exit_code)

    def logs(self, record: RunRecord, rank: int | None, follow: bool) -> int:
        """The run's logs printed here, as they grow with ``follow``."""
        if self.has_clusterkit:
            args = ["logs", record.run_dir, *(["--rank", str(rank)] if rank is not None else []), *(["-f"] if follow else [])]
            return self.session.run(self.clusterkit(*args), timeout=7 * 24 * 3600,
                                    stdout=sys.stdout.buffer, stderr=sys.stderr.buffer).returncode
        if rank is not None:
            raise SSHError(f"logs --rank needs clusterkit on {self.session.endpoint.host} (login.python in the "
                           f"cluster profile names the interpreter it is installed in)")
        from clusterkit.runs.logs import stream

        def node_logs() -> list[RemoteFile]:
            names = self.session.sftp.listdir(record.run_dir)
            return [RemoteFile(self.session, f"{record.run_dir}/{name}")
                    for stream in STREAMS for name in sorted(names)
                    if fnmatch.fnmatchcase(name, node_log(record.job_id, "*", stream))]

        return stream(node_logs, lambda: self.status(record).done, follow, base=record.run_dir)

    def cancel(self, record: RunRecord) -> None:
        self.session.check(command_line(["scancel", record.job_id]))


def remote_record(record: RunRecord, login: Login) -> RunRecord:
    """The local record of a run submitted over SSH."""
    data: dict[str, Any] = {**asdict(record), "scheduler": "ssh", "login": msgspec.to_builtins(login)}
    return RunRecord(**data)


def login_of(record: RunRecord) -> Login:
    return msgspec.convert(record.login, Login)


def remote_statuses(records: list[RunRecord], accept_new_host_key: bool = False,
                    unreachable_ok: bool = False) -> dict[int, JobStatus]:
    """The status of each ssh run (keyed by ``id(record)``), asked over one connection per login
    node. With ``unreachable_ok`` (listings), a login node that cannot be reached makes its runs
    UNKNOWN, with the reason, instead of failing the whole listing."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(json.dumps(record.login, sort_keys=True), []).append(record)
    found: dict[int, JobStatus] = {}
    for group in groups.values():
        login = login_of(group[0])

        def ask(session: SSHSession, group: list[RunRecord] = group, login: Login = login) -> dict[int, JobStatus]:
            node = LoginNode(session, login)
            return {id(record): node.status(record) for record in group}

        try:
            found.update(read_only(login, ask, accept_new_host_key))
        except SSHError as exc:
            if not unreachable_ok:
                raise
            found.update({id(record): JobStatus(UNKNOWN, reason=str(exc)) for record in group})
    return found


def local_record_dir(request: SubmitRequest, job_id: str) -> Path:
    """Where this machine keeps an ssh run's record: runs_dir (when relative, else ./runs) here,
    ``<name>/<job id>@<host>``, so ``clusterkit status JOB`` finds it as it finds local runs."""
    assert request.login is not None
    runs_dir = Path(request.runs_dir).expanduser()
    return (Path("runs") if runs_dir.is_absolute() else runs_dir) / request.name / f"{job_id}@{request.login.host}"


def submit(request: SubmitRequest, node: LoginNode | None = None) -> RunRecord:
    """Submit on the login node (through ``node`` when the caller holds a session, to follow the
    job over the same connection) and keep the run's record here."""
    assert request.login is not None
    if node is None:
        with connect(request.login) as session:
            return submit(request, LoginNode(session, request.login))
    record = remote_record(node.submit(request), request.login)
    local_dir = local_record_dir(request, record.job_id)
    local_dir.mkdir(parents=True, exist_ok=True)
    record.write(local_dir)
    return record


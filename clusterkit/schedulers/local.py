"""The local adapter: runs the same batch script on this machine, with ``srun`` and ``scontrol``
stand-ins (:mod:`clusterkit.schedulers.local_slurm`) that start one process per node — the same env contract
as SLURM, so a laptop can try a recipe."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from clusterkit.errors import SchedulerError
from clusterkit.runs.arrays import array_status, task_record
from clusterkit.runs.function_results import function_status
from clusterkit.runs.index import add_run
from clusterkit.runs.logs import Readable, stream_run
from clusterkit.runs.node_choice import NodeChoice, chosen_host
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import (
    CANCELLED,
    COMPLETED,
    FAILED,
    PENDING,
    RUNNING,
    JobStatus,
    exit_code_from_run_dir,
    explained,
)
from clusterkit.schedulers.api import JOB_ID_FIELD, SubmitRequest, creating_run_dir
from clusterkit.schedulers.code_snapshot import tar_bytes, unpack
from clusterkit.schedulers.host import attached
from clusterkit.schedulers.local_slurm import (
    ARRAY_MARKER,
    JOB_MARKER,
    KILL_WAIT_S,
    carries,
    job_markers,
    processes_with,
    terminate,
)
from clusterkit.schedulers.secret_values import secrets_payload, write_private
from clusterkit.spec.function_jobs import RECORD_LAUNCHER
from clusterkit.spec.layout import (
    CANCELLED_MARKER,
    LAUNCH_PLAN,
    LOCAL_JOB_IDS,
    SECRETS_FILE,
    SHIM_DIR,
    SNAPSHOT_DIR,
    batch_log,
)
from clusterkit.spec.profile import Login
from clusterkit.supervisor.stacks import STACKS_SIGNAL

SHIMS = ("srun", "scontrol")

# What this executor cannot run (schedulers.api.check_capabilities reads these).
UNSUPPORTED = {
    "batch_launcher": "process_model: batch_launcher needs SLURM (launcher {recipe.launcher} calls srun itself); the "
    "local executor cannot run it",
    "dependency": "--after/--singleton need SLURM's queue; the local executor runs a job at once",
    "service": "service: the service role needs SLURM (its steps are placed on named nodes of the allocation); the "
    "local executor cannot run it",
    "components": "components: a heterogeneous job needs SLURM (each component is a hetjob group of the "
    "allocation, started with srun --het-group); the local executor cannot run it",
    "pyxis": "a pyxis container needs SLURM's srun (its --container-* options); the local executor cannot run it",
}
MAX_NODES = 254
NODES = "127.0.0.1-254"  # its nodes are loopback addresses


def allocate_job_id(ids_dir: Path, start: int) -> str:
    """The first id from ``start`` up that no other submit under this runs_dir holds."""
    ids_dir.mkdir(parents=True, exist_ok=True)
    job_id = start
    while True:
        try:
            os.close(os.open(ids_dir / str(job_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return str(job_id)
        except FileExistsError:
            job_id += 1


def local_hosts(nodes: int) -> list[str]:
    """Distinct loopback addresses stand in for node names (all reach this machine on Linux)."""
    return [f"127.0.0.{index + 1}" for index in range(nodes)]


def _write_shims(shim_dir: Path) -> None:
    shim_dir.mkdir()
    for shim in SHIMS:
        path = shim_dir / shim
        # A Python script, not /bin/sh: dash would drop the exported clusterkit_node function
        # (BASH_FUNC_clusterkit_node%%) from the environment the nodes' commands need.
        path.write_text(
            f"#!{sys.executable}\nimport sys\nfrom clusterkit.schedulers.local_slurm import main\nsys.exit(main({shim!r}, sys.argv[1:]))\n"
        )
        path.chmod(0o755)


def write_run_files(request: SubmitRequest, run_dir: Path) -> None:
    for file_name, text in request.files.items():
        (run_dir / file_name).parent.mkdir(parents=True, exist_ok=True)  # <index>/ (a sweep point), supervisor/
        (run_dir / file_name).write_text(text, encoding="utf-8")
    (run_dir / request.script_name).chmod(0o755)


def _create_run_dir(request: SubmitRequest) -> tuple[str, Path]:
    """The run directory with all the job's files, complete or not at all: written in the staging
    directory, then renamed to a job id (a numeric one: the script does arithmetic on it)."""
    root, staging = Path(request.runs_root), Path(request.staging)
    secrets = secrets_payload(request.secrets)  # a missing one: nothing written, nothing started
    with creating_run_dir(root):
        root.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        try:
            write_run_files(request, staging)
            if secrets:
                write_private(str(staging / SECRETS_FILE), secrets)
            if request.snapshot:
                unpack(tar_bytes(request.snapshot), str(staging / SNAPSHOT_DIR))
            _write_shims(staging / SHIM_DIR)
            job_id = allocate_job_id(root.parent / LOCAL_JOB_IDS, time.time_ns() // 1_000_000 % 1_000_000_000)
            while (root / job_id).exists():  # a run directory from before the ids were kept
                job_id = allocate_job_id(root.parent / LOCAL_JOB_IDS, int(job_id) + 1)
            staging.rename(root / job_id)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return job_id, root / job_id


def job_environment(job_id: str, name: str, nodes: int, run_dir: Path | str) -> dict[str, str]:
    """This environment as the job's batch shell gets it: SLURM's job variables, the stand-ins first
    on PATH, and the job's marker."""
    env = dict(os.environ)
    env.update(
        PATH=f"{Path(run_dir) / SHIM_DIR}{os.pathsep}{env.get('PATH', '')}",
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME=name,
        SLURM_JOB_NODELIST=",".join(local_hosts(nodes)),
        SLURM_NNODES=str(nodes),
        CLUSTERKIT_EXECUTOR="local",
        **{JOB_MARKER: str(run_dir)},  # every process of the job inherits it: cancel finds them all
    )
    return env


def _start(request: SubmitRequest, job_id: str, run_dir: Path) -> subprocess.Popen[bytes]:
    env = job_environment(job_id, request.name, request.nodes + request.spare_nodes, run_dir)
    for name in request.secrets:  # as on SLURM: the job reads them from its file, not from the submitter
        env.pop(name, None)
    if request.tasks or request.links:  # a job array or chain: its tasks are started, a few at a time, by local_array
        env[ARRAY_MARKER] = str(run_dir)
        indices = request.tasks or tuple(range(request.links))
        argv = [
            sys.executable,
            "-m",
            "clusterkit.schedulers.local_array",
            str(run_dir),
            str(request.array_throttle or len(indices)),
            request.script_name,
            "array" if request.tasks else "chain",
            *map(str, indices),
        ]
    else:
        argv = [word.replace(JOB_ID_FIELD, job_id) for word in request.argv]
    with open(run_dir / batch_log(job_id, "out"), "ab") as out, open(run_dir / batch_log(job_id, "err"), "ab") as err:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # not in the terminal's process group: Ctrl-C there is not for it
        )


class LocalScheduler:
    """Runs the batch script on this machine; its state is its batch process and run directory."""

    def submit(self, request: SubmitRequest) -> RunRecord:
        job_id, run_dir = _create_run_dir(request)
        try:
            with creating_run_dir(run_dir):
                for index in request.tasks:
                    (run_dir / str(index)).mkdir(exist_ok=True)
            process = _start(request, job_id, run_dir)
            record, *tasks = request.records(job_id, str(run_dir), time.time(), pid=process.pid)
            with creating_run_dir(run_dir):
                for task in tasks:
                    task.write()
                record.write()
        except BaseException:
            # No record, no job: what started is stopped (found by its marker, even when an interrupt
            # came before Popen returned its pid) and the run directory removed.
            terminate(job_markers(run_dir))
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        add_run(record, run_dir)
        return record

    def status(self, record: RunRecord) -> JobStatus:
        if record.tasks:
            return array_status([self.status(task_record(record, index)) for index in record.tasks])
        if record.links and record.pid and carries(record.pid, (f"{ARRAY_MARKER}={record.run_dir}",)):
            return JobStatus(RUNNING, reason=f"a chain of {record.links} links")  # its links run one by one
        return explained(record, _batch_status(record))

    def statuses(self, records: list[RunRecord]) -> list[JobStatus]:
        return [self.status(record) for record in records]  # no scheduler to ask: each run's processes and files

    def cancel(self, record: RunRecord, grace_s: float = KILL_WAIT_S) -> None:
        """Stop every process of the job (only those carrying its marker: a reused pid is left
        alone), SIGTERM first, SIGKILL after ``grace_s``; for a job array, of every task."""
        (record.path / CANCELLED_MARKER).touch()
        if record.launcher == RECORD_LAUNCHER:
            _end_function_job(record, grace_s)
            return
        (record.path / SECRETS_FILE).unlink(missing_ok=True)  # no later attempt needs them
        for index in record.tasks:
            (record.path / str(index) / CANCELLED_MARKER).touch()
        terminate(
            (f"{ARRAY_MARKER}={record.run_dir}",) if record.tasks or record.links else job_markers(record.run_dir),
            grace_s,
        )

    def ask_stacks(self, record: RunRecord) -> None:
        # The batch process is the supervisor (the script execs it), if that pid is still it.
        if not (record.pid and carries(record.pid, job_markers(record.run_dir))):
            raise SchedulerError(f"job {record.job_id}: its supervisor is not running")
        os.kill(record.pid, STACKS_SIGNAL)

    def logs(self, record: RunRecord, rank: int | None, follow: bool, out: BinaryIO | None = None) -> int:
        return stream_run(record, rank, follow, done=lambda: self.status(record).done, out=out)

    def run_file(self, record: RunRecord, name: str) -> Readable:
        return record.path / name

    def exec(self, record: RunRecord, choice: NodeChoice, command: Sequence[str], tty: bool = False) -> int:
        """``command`` as a process of this machine, in the run directory, with the environment the
        chosen node's processes start from (its SLURM_NODEID and SLURMD_NODENAME) and the job's
        marker, so that cancelling the job ends it too, as SLURM ends a step with its job. No cgroup,
        no other machine: every node of a local job is this one. ``tty``: this terminal."""
        hosts = local_hosts(record.nodes + record.spare_nodes)
        host = chosen_host(record.job_id, hosts, choice, self.run_file(record, LAUNCH_PLAN))
        env = job_environment(record.job_id, record.name, record.nodes + record.spare_nodes, record.run_dir)
        env.update(
            SLURM_NODEID=str(hosts.index(host)),
            SLURMD_NODENAME=host,
            RUN_DIR=record.run_dir,
            CLUSTERKIT_RUN_DIR=record.run_dir,
            CLUSTERKIT_JOB_ID=record.job_id,
        )
        return attached(command, cwd=record.run_dir, env=env)


SUBMITIT_LOCAL = "SUBMITIT_EXECUTOR=local"  # in the environment of submitit's local job controller


def _end_function_job(record: RunRecord, grace_s: float) -> None:
    """SIGINT to submitit's local controller, which ends its tasks (as its LocalJob.cancel asks); what
    is left after ``grace_s``, SIGKILLed: the controller and its tasks (SUBMITIT_LOCAL_JOB_ID=<its pid>).
    A reused pid, without submitit's variable, is left alone."""
    controller = (SUBMITIT_LOCAL,)
    if record.pid and carries(record.pid, controller):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while carries(record.pid, controller) and time.monotonic() < deadline:
            time.sleep(0.2)
        if carries(record.pid, controller):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)
    terminate((SUBMITIT_LOCAL, f"SUBMITIT_LOCAL_JOB_ID={record.pid}"), grace_s)


def _batch_status(record: RunRecord) -> JobStatus:
    if (record.path / CANCELLED_MARKER).exists():
        return JobStatus(CANCELLED)
    if record.launcher == RECORD_LAUNCHER:  # a function's job: submitit's LocalExecutor, not our batch process
        return function_status(record, bool(record.pid and carries(record.pid, (SUBMITIT_LOCAL,))))
    # The batch process, if that pid is still it (it carries the job's marker; a reused pid does not).
    # It runs on after writing the exit code (post_run hooks, notices), as SLURM's job is COMPLETING
    # until its batch script ends: done is when nothing of the job is left.
    if record.pid and carries(record.pid, job_markers(record.run_dir)):
        return JobStatus(RUNNING)
    exit_code = exit_code_from_run_dir(record.path)
    if exit_code is not None:
        return JobStatus(COMPLETED if exit_code == 0 else FAILED, exit_code)
    # An array task: its processes carry its marker; before they start, its array's starter runs.
    if processes_with(job_markers(record.run_dir)):
        return JobStatus(RUNNING)
    if record.pid and carries(record.pid, (f"{ARRAY_MARKER}={record.path.parent}",)):
        return JobStatus(PENDING)
    return JobStatus(FAILED, reason="the local batch process ended without an exit code")


@contextlib.contextmanager
def open_scheduler(login: Login | None = None, accept_new_host_key: bool = False) -> Iterator[LocalScheduler]:
    yield LocalScheduler()

"""The SLURM adapter, on this machine or on a login node: one code path over a :class:`Host`.

Submitting: the request's files go into its staging directory, the request's argv
(``sbatch --parsable --hold <staging>/job.sbatch``) queues the script held, the staging directory
becomes ``<job id>/`` with the run record in it, and ``scontrol release`` lets the job start. SLURM
creates no folders for ``--output``, hence the hold; a failure at any step cancels the held job and
removes what was written.

Plain ``sbatch --parsable``, not submitit: submitit's public API submits Python functions, and the
only way to hand it a ready-made script is its private ``_submit_command`` (whose own docstring says
not to call it). ``--parsable`` is SLURM's stable, documented answer for tools, and the same argv
runs unchanged over SSH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from clusterkit.errors import ExternalError, SchedulerError, SubmitError, UsageError
from clusterkit.runs.arrays import array_status, chain_status, task_record
from clusterkit.runs.index import add_run
from clusterkit.runs.logs import Readable, stream_run
from clusterkit.runs.node_choice import NodeChoice, chosen_host
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import RUNNING, JobStatus, explained, normalize_slurm_state, slurm_status
from clusterkit.schedulers.api import SubmitRequest, creating_run_dir
from clusterkit.schedulers.code_snapshot import tar_bytes
from clusterkit.schedulers.host import Host, LocalHost, checked
from clusterkit.schedulers.secret_values import secrets_payload
from clusterkit.schedulers.slurm_queue import Fields, ask_slurm, read_scontrol
from clusterkit.spec.arrays import task_job_id
from clusterkit.spec.layout import (
    CANCELLED_MARKER,
    EXIT_CODE,
    LAUNCH_PLAN,
    RETRIES,
    RUN_RECORD,
    SECRETS_FILE,
    SNAPSHOT_DIR,
)
from clusterkit.spec.profile import Login
from clusterkit.supervisor.recovery import retry_lock
from clusterkit.supervisor.stacks import STACKS_SIGNAL_NUMBER

# SLURM runs every job clusterkit renders (schedulers.api.check_capabilities).
UNSUPPORTED: dict[str, str] = {}
MAX_NODES = None

SUBMIT_TIMEOUT_S = 300.0  # sbatch on a busy controller can take minutes


def exec_argv(job_id: str, host: str, command: Sequence[str], tty: bool = False) -> list[str]:
    """srun into the job's allocation on one node, as a step beside the job's own (--overlap:
    it shares their CPUs and memory instead of waiting for them), inside the job's cgroup; ``--``
    ends srun's options, so a command word that starts with ``-`` is the command's."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        *(["--pty"] if tty else []),
        "-w",
        host,
        "--",
        *command,
    ]


def parse_job_id(output: str) -> str:
    """The job id from ``sbatch --parsable``: ``<id>`` or ``<id>;<cluster>``."""
    answer = re.fullmatch(r"([0-9]+)(;[\w.-]+)?", output.strip())
    if answer is None:
        raise SubmitError(f"sbatch answered {output.strip()!r}, not a job id")
    return answer.group(1)


@dataclasses.dataclass(frozen=True)
class _Asking:
    exit_codes: dict[str, int | None]  # the SLURM jobs asked about -> the exit code in their run directory
    status: Callable[[Mapping[str, Fields]], JobStatus]  # the run's state from what SLURM said of them


class SlurmScheduler:
    def __init__(self, host: Host | None = None):
        self.host = host or LocalHost()

    def submit(self, request: SubmitRequest) -> RunRecord:
        host = self.host
        job_id: str | None = None
        secrets = secrets_payload(request.secrets)  # a missing one: nothing written, nothing queued
        try:
            with creating_run_dir(request.runs_root):
                host.make_dirs(request.staging)
                for folder in sorted({name.rpartition("/")[0] for name in request.files} - {""}):
                    host.make_dirs(f"{request.staging}/{folder}")  # a sweep point's files
                for name, text in request.files.items():
                    host.write_file(f"{request.staging}/{name}", text, 0o755 if name.endswith(".sbatch") else 0o644)
                if secrets:
                    host.write_private(f"{request.staging}/{SECRETS_FILE}", secrets)
                if request.snapshot:
                    host.unpack(tar_bytes(request.snapshot), f"{request.staging}/{SNAPSHOT_DIR}")
            for script in request.uploads:
                host.upload(script, script)
            done = host.run(request.argv, timeout=SUBMIT_TIMEOUT_S)
            if done.returncode != 0:
                said = "; ".join(line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip())
                raise SubmitError(f"sbatch refused the job: {said or f'exit code {done.returncode}'}")
            job_id = parse_job_id(done.stdout)
            run_dir = host.absolute(f"{request.runs_root}/{job_id}")
            with creating_run_dir(run_dir):
                host.rename(request.staging, run_dir)
                # A job array's tasks get their run directories (SLURM writes their logs there) and records.
                record, *tasks = request.records(job_id, run_dir, time.time())
                for task in tasks:
                    host.make_dirs(task.run_dir)
                    host.write_file(f"{task.run_dir}/{RUN_RECORD}", task.to_json())
                host.write_file(f"{run_dir}/{RUN_RECORD}", record.to_json())
            checked(host, ["scontrol", "release", job_id])
        except BaseException:
            self._undo(request, job_id)
            raise
        if isinstance(host, LocalHost):  # over SSH, the local record is indexed where it is written
            add_run(record, Path(record.run_dir))
        return record

    def _undo(self, request: SubmitRequest, job_id: str | None) -> None:
        """After a failed submit: no held job in the queue and nothing written, as far as the host
        still answers (when it does not, the error that brought us here is the one to report)."""
        try:
            if job_id is not None:
                self.host.run(["scancel", job_id])
                self.host.remove_tree(self.host.absolute(f"{request.runs_root}/{job_id}"))
            self.host.remove_tree(request.staging)
        except ExternalError:
            pass

    def status(self, record: RunRecord) -> JobStatus:
        return self.statuses([record])[0]

    def statuses(self, records: list[RunRecord]) -> list[JobStatus]:
        """Each run's state from one squeue call for all of them, every array task, chain link and
        retry included, and one sacct call for those that have ended
        (:func:`~clusterkit.schedulers.slurm_queue.ask_slurm`)."""
        asking = [self._asking(record) for record in records]
        said = ask_slurm(self.host, {job_id: code for ask in asking for job_id, code in ask.exit_codes.items()})
        return [ask.status(said) for ask in asking]

    def _asking(self, record: RunRecord) -> _Asking:
        """The SLURM jobs the run's state is made of, and how it is made from what SLURM says of them."""
        if record.tasks:
            tasks = [self._asking(task_record(record, index)) for index in record.tasks]
            return _Asking(
                {job_id: code for task in tasks for job_id, code in task.exit_codes.items()},
                lambda said: array_status([task.status(said) for task in tasks]),
            )
        exit_code = self._exit_code(record)
        if record.links:
            links = [task_job_id(record.job_id, link) for link in range(record.links)]
            return _Asking(
                dict.fromkeys(links, exit_code),
                lambda said: chain_status(
                    [slurm_status(said.get(link), exit_code) for link in links],
                    explained(record, slurm_status(None, exit_code)),
                ),
            )
        retry = self._latest_retry(record)
        job_id = retry["job_id"] if retry else record.job_id  # a retried run goes on as its newest retry's job

        def status(said: Mapping[str, Fields]) -> JobStatus:
            status = explained(record, slurm_status(said.get(job_id), exit_code))
            if retry is None:
                return status
            retried = f"retry {retry['retry']} as job {job_id}" + (
                f", excluding {retry['excluded']}" if retry.get("excluded") else ""
            )
            return dataclasses.replace(status, reason=f"{retried}; {status.reason}" if status.reason else retried)

        return _Asking({job_id: exit_code}, status)

    def _latest_retry(self, record: RunRecord) -> dict | None:
        """The newest line of the run's retries.jsonl (each retry the supervisor submitted)."""
        try:
            with self.host.open(f"{record.run_dir}/{RETRIES}") as handle:
                lines = [json.loads(line) for line in handle.read().decode().splitlines() if line.strip()]
        except (OSError, ValueError):
            return None
        valid = [
            line for line in lines if isinstance(line, dict) and re.fullmatch(r"[0-9]+", str(line.get("job_id", "")))
        ]
        return valid[-1] if valid else None

    def _exit_code(self, record: RunRecord) -> int | None:
        try:
            with self.host.open(f"{record.run_dir}/{EXIT_CODE}") as handle:
                return int(handle.read().decode().strip())
        except (OSError, ValueError):
            return None

    def cancel(self, record: RunRecord) -> None:
        # Recorded first, under the run's retry lock where the run dir is on this machine: no retry
        # (the supervisor's, clusterkit watch's) starts after it, and one submitted before is the
        # newest retry read here and cancelled too.
        with retry_lock(record.path) if isinstance(self.host, LocalHost) else contextlib.nullcontext():
            self.host.write_file(f"{record.run_dir}/{CANCELLED_MARKER}", f"{time.time()}\n")
            retry = self._latest_retry(record)  # a retried run goes on as its newest retry's job
            try:
                checked(self.host, ["scancel", record.job_id, *([retry["job_id"]] if retry else [])])
            except SchedulerError as exc:
                raise SchedulerError(f"cannot cancel job {record.job_id}: {exc}") from None
        self.host.remove_tree(f"{record.run_dir}/{SECRETS_FILE}")  # no later attempt needs them

    def ask_stacks(self, record: RunRecord) -> None:
        # The batch step's process is the supervisor (the script execs it); not the job's steps:
        # their ranks dump only when the supervisor asks, so that it knows when to read.
        retry = self._latest_retry(record)
        job_id = retry["job_id"] if retry else record.job_id
        try:
            checked(self.host, ["scancel", "--batch", f"--signal={STACKS_SIGNAL_NUMBER}", job_id])
        except SchedulerError as exc:
            raise SchedulerError(f"cannot ask job {record.job_id} for its stacks: {exc}") from None

    def logs(self, record: RunRecord, rank: int | None, follow: bool, out: BinaryIO | None = None) -> int:
        return stream_run(record, rank, follow, done=lambda: self.status(record).done, out=out)

    def run_file(self, record: RunRecord, name: str) -> Readable:
        return record.path / name

    def exec(self, record: RunRecord, choice: NodeChoice, command: Sequence[str], tty: bool = False) -> int:
        job_id, hosts = self._allocation(record)
        host = chosen_host(record.job_id, hosts, choice, self.run_file(record, LAUNCH_PLAN))
        return self.host.attach(exec_argv(job_id, host, command, tty), tty)

    def _allocation(self, record: RunRecord) -> tuple[str, list[str]]:
        """The SLURM job that runs the run now (a retry's, a chain's running link) and its nodes in
        SLURM_NODEID order. From SLURM, not the hostfile the supervisor writes: that one lists the
        training nodes only (no service nodes), is written a while after the job starts, can be an
        earlier attempt's on other nodes, and lies in a folder the job's own code may write to."""
        retry = self._latest_retry(record)
        asked = retry["job_id"] if retry else record.job_id
        said = read_scontrol(checked(self.host, ["scontrol", "--oneliner", "show", "job", asked]))
        running = [fields for fields in said.values() if normalize_slurm_state(fields.get("JobState", "")) == RUNNING]
        if not running or not running[0].get("NodeList"):
            raise UsageError(f"job {record.job_id} is not running any more: nothing to run a command in")
        hosts = checked(self.host, ["scontrol", "show", "hostnames", running[0]["NodeList"]]).split()
        return running[0]["JobId"], hosts


@contextlib.contextmanager
def open_scheduler(login: Login | None = None, accept_new_host_key: bool = False) -> Iterator[SlurmScheduler]:
    yield SlurmScheduler()

"""The job environment: what the supervisor asks of the scheduler it runs under (submitit's
``JobEnvironment`` is the model). :class:`SlurmEnvironment` reads SLURM's variables and calls its
commands; :class:`LocalEnvironment` is the local executor's (its ``srun`` stand-in starts the
tasks; there is no queue to requeue into or submit to). The unit tests give the supervisor a fake.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence


class JobEnvironment:
    """The running job as SLURM's variables describe it (the local executor sets the same ones)."""

    executor = ""
    can_requeue = False  # requeue() can put this job back in the queue
    can_submit = False  # submit_held() can queue another job (a retry)

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        self.environ: Dict[str, str] = dict(os.environ if environ is None else environ)

    @property
    def slurm_job_id(self) -> str:
        return self.environ.get("SLURM_JOB_ID", "0")

    @property
    def job_id(self) -> str:
        """clusterkit's id of this job: an array task's is ``<array id>_<task id>``, which is also
        what ``scontrol requeue`` must be given (the array's own id would requeue every task)."""
        array, task = self.environ.get("SLURM_ARRAY_JOB_ID"), self.environ.get("SLURM_ARRAY_TASK_ID")
        return f"{array}_{task}" if array and task else self.slurm_job_id

    @property
    def restarts(self) -> int:
        """How many times this job was requeued (SLURM_RESTART_COUNT)."""
        return _count(self.environ.get("SLURM_RESTART_COUNT"))

    @property
    def retry(self) -> int:
        """Which automatic retry of the run this job is (0: the first job)."""
        return _count(self.environ.get("CLUSTERKIT_RETRY"))

    @property
    def retry_of(self) -> str:
        """The run's first job: retries continue its run directory."""
        return self.environ.get("CLUSTERKIT_RETRY_OF") or self.slurm_job_id

    @property
    def submit_dir(self) -> str:
        return self.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()

    def hosts(self) -> List[str]:
        raise NotImplementedError

    def group_hosts(self, group: int) -> List[str]:
        """The hosts of a heterogeneous job's component ``group`` (SLURM_JOB_NODELIST_HET_GROUP_<n>)."""
        raise NotImplementedError

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> "subprocess.Popen[bytes]":
        """Start a step (``srun ...``) or a program in the batch shell."""
        return subprocess.Popen(list(argv), env=dict(env))

    def requeue(self) -> bool:
        return False

    def signal_job(self, signum: int) -> None:
        """Send ``signum`` to every process of the job's steps, on every node."""
        from .processes import descendants

        for pid in descendants(os.getpid()):  # here, the job's processes are all below this one
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def signal_group(self, group: int, signum: int) -> bool:
        """Send ``signum`` to the tasks of a heterogeneous job's component ``group`` (its srun steps);
        False where nothing can (then only ending the step's srun stops them)."""
        return False

    def submit_held(self, argv: Sequence[str], env: Mapping[str, str]) -> Optional[str]:
        return None

    def release(self, job_id: str) -> bool:
        return False


class SlurmEnvironment(JobEnvironment):
    executor = "slurm"
    can_requeue = True
    can_submit = True

    def hosts(self) -> List[str]:
        return self._hostnames("SLURM_JOB_NODELIST")  # a heterogeneous job's: its first group's

    def group_hosts(self, group: int) -> List[str]:
        variable = f"SLURM_JOB_NODELIST_HET_GROUP_{group}"
        # Unset: not a heterogeneous job (scontrol would read SLURM_JOB_NODELIST, group 0's, instead).
        return self._hostnames(variable) if self.environ.get(variable) else []

    def _hostnames(self, variable: str) -> List[str]:
        done = subprocess.run(
            ["scontrol", "show", "hostnames", self.environ.get(variable, "")],
            stdout=subprocess.PIPE,
            check=True,
            universal_newlines=True,
        )
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def requeue(self) -> bool:
        return subprocess.run(["scontrol", "requeue", self.job_id]).returncode == 0

    def signal_job(self, signum: int) -> None:
        # Every step's processes on every node, through slurmstepd (not the batch shell: this one).
        subprocess.run(["scancel", f"--signal={signum}", self.job_id])

    def signal_group(self, group: int, signum: int) -> bool:
        # srun ends its step with SIGKILL when it gets SIGTERM itself; through slurmstepd the tasks
        # get the signal as it is (<job>+<offset> names a component's own steps, not the batch shell).
        return subprocess.run(["scancel", f"--signal={signum}", f"{self.slurm_job_id}+{group}"]).returncode == 0

    def submit_held(self, argv: Sequence[str], env: Mapping[str, str]) -> Optional[str]:
        """``sbatch --parsable --hold ...``: the new job's id, or None where sbatch refused it."""
        done = subprocess.run(list(argv), env=dict(env), stdout=subprocess.PIPE, universal_newlines=True)
        job_id = done.stdout.strip().split(";")[0]
        return job_id if done.returncode == 0 and job_id.isdigit() else None

    def release(self, job_id: str) -> bool:
        return subprocess.run(["scontrol", "release", job_id]).returncode == 0


class LocalEnvironment(JobEnvironment):
    """The local executor: the nodes are loopback addresses it lists in SLURM_JOB_NODELIST, its
    ``srun`` stand-in (first on PATH) starts the tasks, every process of the job is below this one,
    and nothing can requeue or queue a job."""

    executor = "local"

    def hosts(self) -> List[str]:
        return [host for host in self.environ.get("SLURM_JOB_NODELIST", "").split(",") if host]


def current(environ: Optional[Mapping[str, str]] = None) -> JobEnvironment:
    environ = os.environ if environ is None else environ
    return LocalEnvironment(environ) if environ.get("CLUSTERKIT_EXECUTOR") == "local" else SlurmEnvironment(environ)


def _count(text: Optional[str]) -> int:
    return int(text) if text and text.isdigit() else 0

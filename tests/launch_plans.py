"""Reading a rendered job's launch plan in tests: the steps the supervisor will run, as data."""

from __future__ import annotations

from clusterkit.render.job import RenderedJob
from clusterkit.supervisor import node, steps
from clusterkit.supervisor.environment import JobEnvironment
from clusterkit.supervisor.plan import LaunchPlan, Step, load_plan


def plan_of(job: RenderedJob, prefix: str = "") -> LaunchPlan:
    """The plan of a rendered job (``prefix``: a sweep point's folder, ``"0/"``)."""
    return load_plan(job.files[f"{prefix}plan.json"])


def command(step: Step) -> str:
    """The step's program as one line (words joined by a space), for looking for a run of words in
    it; where a word's own spaces matter, compare ``step.argv``."""
    return " ".join(step.argv)


HOSTS = ["node1", "node2", "node3", "node4"]


class _Recorded(JobEnvironment):
    """A job environment that records what the supervisor would start instead of starting it."""

    def __init__(self, environ: dict[str, str]) -> None:
        super().__init__(environ)
        self.argv: list[str] = []
        self.env: dict[str, str] = {}

    def hosts(self) -> list[str]:
        return HOSTS

    def spawn(self, argv, env):
        self.argv, self.env = list(argv), dict(env)
        return None


def started(plan: LaunchPlan, step: Step, run_dir: str, **environ: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the supervisor starts ``step`` with (srun, or a launcher in the batch
    shell), in a job on node1, node2, ... (as many as the plan asks for) whose rendezvous is node1:12345."""
    job = _Recorded(
        {
            "RUN_DIR": run_dir,
            "CLUSTERKIT_JOB_ID": "7",
            "SLURM_JOB_ID": "7",
            "MASTER_ADDR": "node1",
            "MASTER_PORT": "12345",
            **environ,
        }
    )
    steps.start(plan, step, job, HOSTS[: plan.train_nodes + plan.service_nodes], run_dir, job.environ)
    return job.argv, job.env


def task_argv(step: Step, run_dir: str, **environ: str) -> list[str]:
    """What the node agent runs on node 1 (rank 3, local rank 1) for ``step``."""
    return node.task_argv(
        step,
        {
            "RUN_DIR": run_dir,
            "CLUSTERKIT_JOB_ID": "7",
            "MASTER_ADDR": "node1",
            "MASTER_PORT": "12345",
            "SLURM_NODEID": "1",
            "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1",
            "SLURMD_NODENAME": "node2",
            **environ,
        },
    )

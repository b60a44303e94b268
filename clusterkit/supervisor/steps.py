"""Starting the plan's steps and waiting for them, with the preemption signal passed on.

A step's tasks run under srun, each through the node agent; a step with ``hosts == "batch"`` is a
launcher that runs here, once, and starts the ranks itself (DeepSpeed's ``--launcher slurm``,
mpirun). :class:`Running` is a started step: :meth:`Running.preempt` passes the signal on (srun
forwards it to every task, whose node agent hands it to the ranks), :meth:`Running.wait` its end.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from .environment import JobEnvironment
from .plan import BATCH_VALUES, ENV_PREFIX, LaunchPlan, Step, expand
from .processes import descendants, exit_status, signal_catchers
from .ranks import runtime_values
from .run_files import LAUNCH_PLAN, SUPERVISOR_DIR


def step_hosts(plan: LaunchPlan, step: Step, hosts: Sequence[str]) -> List[str]:
    """The allocation's hosts a step runs on: training's are the first ``train_nodes``, the
    service's the last ``service_nodes``; a one-node check runs on the first; a heterogeneous job's
    component, on ``hosts``, its group's own; Ray's workers on training's but the first (its head's)."""
    if step.hosts == "component":
        return list(hosts)
    if step.hosts == "service":
        return list(hosts[len(hosts) - plan.service_nodes :])
    if step.hosts == "first":
        return list(hosts[:1])
    if step.hosts == "all":  # each node of the allocation once (a container made or removed on each)
        return list(hosts)
    if step.hosts == "rest":
        return list(hosts[1 : plan.train_nodes])
    return list(hosts[: plan.train_nodes])


def srun_options(step: Step, run_dir: str, values: Mapping[str, str]) -> List[str]:
    """The step's srun options besides its layout: the plan's, then its logs."""
    options = [
        expand(word, dict(values)) if index in step.srun_expand else word for index, word in enumerate(step.srun)
    ]
    out, err = (expand(log, dict(values)) for log in step.logs)  # a trial's: steps/<name>/{trial}/
    return [*options, "--open-mode=append", f"--output={run_dir}/{out}", f"--error={run_dir}/{err}"]


def srun_argv(
    plan: LaunchPlan, step: Step, hosts: Sequence[str], run_dir: str, values: Mapping[str, str], python: Sequence[str]
) -> List[str]:
    """The step's srun command: its layout, options and logs, and on each task the node agent
    (which runs the program) or, for a bare check, the program itself."""
    on = step_hosts(plan, step, hosts)[: step.nodes]
    task = (
        [*(step.agent_python or python), f"{run_dir}/{SUPERVISOR_DIR}", "node", f"{run_dir}/{LAUNCH_PLAN}", step.name]
        if step.agent
        else _expanded(step, values)
    )
    return [
        "srun",
        *([] if step.het_group is None else [f"--het-group={step.het_group}"]),
        f"--nodes={step.nodes}",
        f"--ntasks={step.ntasks}",
        f"--ntasks-per-node={step.tasks_per_node}",
        f"--nodelist={','.join(on)}",
        *srun_options(step, run_dir, values),
        *task,
    ]


def batch_argv(step: Step, environ: Mapping[str, str]) -> List[str]:
    """A step's argv as run here in the batch shell, its run-time values filled in."""
    return _expanded(step, _batch_values(environ))


def _expanded(step: Step, values: Mapping[str, str]) -> List[str]:
    return [expand(word, dict(values)) if index in step.expand else word for index, word in enumerate(step.argv)]


class Running:
    """A started step."""

    def __init__(self, step: Step, process: "subprocess.Popen[bytes]") -> None:
        self.step = step
        self.process = process

    def preempt(self, signum: int) -> None:
        if self.process.poll() is not None:
            return
        if self.step.hosts == "batch":  # the launcher here: the ranks below it that handle the signal
            signal_catchers([self.process.pid, *descendants(self.process.pid)], signum)
        else:  # srun passes it to every task's node agent
            self.process.send_signal(signum)

    def stop(self) -> int:
        """End the step (SIGTERM: srun passes it to its tasks) and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
        return self.wait()

    def wait(self) -> int:
        return exit_status(self.process.wait())

    def poll(self, timeout_s: float) -> Optional[int]:
        """The exit status once the step ends within ``timeout_s``, else None."""
        try:
            return exit_status(self.process.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            return None


def start(
    plan: LaunchPlan, step: Step, job: JobEnvironment, hosts: Sequence[str], run_dir: str, environ: Mapping[str, str]
) -> Running:
    values = _batch_values(environ)
    if step.hosts == "batch":
        argv = _expanded(step, values)
        if step.srun_flag:  # its own srun's options, as one argument it splits (each word quoted)
            argv.insert(
                step.srun_at, step.srun_flag + " ".join(shlex.quote(w) for w in srun_options(step, run_dir, values))
            )
        # The step's own values and the recipe's env values (exported by the batch shell) that hold run-time values.
        env = dict(environ, **step.env)
        env.update((name, expand(env[name], values)) for name in step.env_expand if name in env)
    else:
        argv = srun_argv(plan, step, hosts, run_dir, values, [sys.executable])
        env = dict(environ, **step.env)  # srun exports it to the tasks; the agent fills in run-time values
    return Running(step, job.spawn(argv, env))


def _batch_values(environ: Mapping[str, str]) -> Dict[str, str]:
    """The job's run-time values, from the variables the supervisor exported, and its environment's
    variables (``{env:NAME}``)."""
    return {
        name: value
        for name, value in runtime_values(environ).items()
        if name in BATCH_VALUES or name.startswith(ENV_PREFIX)
    }


def answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port(
    job_id: str,
    host: str,
    probe: Optional[Callable[[str, int], bool]] = None,
    first: int = 10000,
    count: int = 20000,
) -> int:
    """The rendezvous port: derived from the job id, in ``first`` .. ``first + count - 1`` (by
    default below Linux's ephemeral range, 32768+, so no outgoing connection holds it). Ids
    ``count`` apart, or jobs of another runs_dir, may still meet on a node, so while something
    listens there it moves on by 997, out of the block of ports that jobs submitted around the same
    time derive (at most 20 tries, then the last one)."""
    port = first + (int(job_id) if job_id.isdigit() else 0) % count
    for _ in range(20):
        if not (probe or answers)(host, port):
            break
        port = first + (port - first + 997) % count
    return port


def wait_until_ready(
    host: str,
    port: int,
    timeout_s: int,
    running: Running,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Optional[str]:
    """None once the service answers at ``host:port``; else why not (it ended, or not in time)."""
    started = clock()
    while not answers(host, port):
        if running.process.poll() is not None:
            return "it ended"
        if clock() - started >= timeout_s:
            return f"not within {timeout_s} s"
        sleep(1.0)
    return None

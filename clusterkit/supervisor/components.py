"""A heterogeneous job's components (``components:``) from the batch shell: each one's srun step
started in its own het group (``srun --het-group=N``) before training, with every component's
address in the environment of every process of the job; training starts once each component with
a port answers there, and the components are stopped when training ends (or one never answers).

What every process is told (docs/guides/heterogeneous-jobs.md): ``CLUSTERKIT_COMPONENTS`` (the
names, training's ``train`` first), ``CLUSTERKIT_COMPONENT`` (its own), and for each component
``CLUSTERKIT_COMPONENT_<NAME>_HOSTS`` / ``_ADDR`` / ``_PORT``. A component's ranks also get their
own ``MASTER_ADDR`` / ``MASTER_PORT`` (its first node, a free port there), for a process group of their own.

The simple case, the ``service:`` role on nodes of the job's own allocation, starts here too
(:func:`start_service`).
"""

from __future__ import annotations

import signal
import socket
from typing import Dict, List, Mapping, Optional, Sequence

from .environment import JobEnvironment
from .plan import Component, LaunchPlan, UnsetVariable, unset_line
from .steps import Running, free_port, start, step_hosts, wait_until_ready

STOP_GRACE_S = 10  # from SIGTERM to a component's tasks until its step is ended
TRAIN = "train"  # training's own name among the components (spec.components.TRAIN)


def prefix(name: str) -> str:
    return f"CLUSTERKIT_COMPONENT_{name.upper()}_"


def told(plan: LaunchPlan, train: Sequence[str], placed: Mapping[str, List[str]]) -> Dict[str, str]:
    """The variables every process of the job gets: where training and each component run."""
    env = {"CLUSTERKIT_COMPONENTS": ",".join([TRAIN, *(c.name for c in plan.components)])}
    ports = {c.name: c.port for c in plan.components}
    for name, hosts in [(TRAIN, list(train)), *placed.items()]:
        env.update({f"{prefix(name)}HOSTS": ",".join(hosts), f"{prefix(name)}ADDR": hosts[0]})
        if ports.get(name) is not None:
            env[f"{prefix(name)}PORT"] = str(ports[name])
    return env


def place(plan: LaunchPlan, job: JobEnvironment) -> Optional[Dict[str, List[str]]]:
    """Each component's hosts, from SLURM's variables for its het group; None where one has none
    (the job was not submitted as a heterogeneous job: said why)."""
    placed = {}
    for component in plan.components:
        hosts = job.group_hosts(component.step.het_group or 0)
        if len(hosts) < component.step.nodes:
            print(
                f"clusterkit: component {component.name} has {len(hosts)} nodes (het group "
                f"{component.step.het_group}), the plan needs {component.step.nodes}: not training",
                flush=True,
            )
            return None
        placed[component.name] = hosts
    return placed


def start_all(
    plan: LaunchPlan, job: JobEnvironment, placed: Mapping[str, List[str]], run_dir: str, env: Mapping[str, str]
) -> Optional[List[Running]]:
    """Every component started, then each with a port waited for; None (and each started one
    stopped) where one cannot start or never answers."""
    running: List[Running] = []
    for component in plan.components:
        hosts = placed[component.name]
        group_job = job.environ.get(f"SLURM_JOB_ID_HET_GROUP_{component.step.het_group}", job.slurm_job_id)
        own = dict(
            env,
            CLUSTERKIT_COMPONENT=component.name,
            MASTER_ADDR=hosts[0],
            MASTER_PORT=str(free_port(group_job, hosts[0])),
        )
        try:  # its command and options are passed as written: no run-time value to miss
            running.append(start(plan, component.step, job, hosts, run_dir, own))
        except OSError as exc:
            print(f"clusterkit: component {component.name} cannot start srun: {exc.strerror or exc}", flush=True)
            stop_all(job, plan.components, running)
            return None
        print(f"clusterkit: component {component.name} started on {','.join(hosts)}", flush=True)
    for component, started in zip(plan.components, running):
        if component.port is None:
            continue
        address = f"{placed[component.name][0]}:{component.port}"
        print(f"clusterkit: waiting up to {component.ready_timeout_s} s for {component.name} at {address}", flush=True)
        why = wait_until_ready(placed[component.name][0], component.port, component.ready_timeout_s, started)
        if why is not None:
            print(
                f"clusterkit: component {component.name} at {address} did not answer ({why}): not training", flush=True
            )
            stop_all(job, plan.components, running)
            return None
        print(f"clusterkit: component {component.name} answers at {address}", flush=True)
    return running


def stop_all(job: JobEnvironment, components: Sequence[Component], running: Sequence[Running]) -> None:
    """Each started component stopped, the last started first: its tasks sent SIGTERM and given
    ``STOP_GRACE_S`` to end, then its step ended (srun, which kills what is left)."""
    for component, started in reversed(list(zip(components, running))):
        code = started.poll(0)
        if code is None and job.signal_group(component.step.het_group or 0, signal.SIGTERM):
            code = started.poll(STOP_GRACE_S)
        code = started.stop() if code is None else code
        print(f"clusterkit: component {component.name} stopped ({code})", flush=True)


def described(plan: LaunchPlan) -> List[str]:
    """One line per component, for ``clusterkit status``: its layout, het group and logs."""
    return [
        f"component {c.name}: {c.step.nodes} nodes x {c.step.tasks_per_node} ranks, het group {c.step.het_group}"
        + (f", port {c.port}" if c.port is not None else "")
        + f", logs {c.step.logs[0].replace('%t', '<rank>')}"
        for c in plan.components
    ]


def start_service(plan: LaunchPlan, job: JobEnvironment, hosts: List[str], run_dir: str, env: Dict[str, str]):
    """The service role started on its nodes and ready, its address added to ``env`` (the launch's):
    Running, None for no service, False where it cannot start or never answered (then stopped)."""
    service = plan.service
    if service is None:
        return None
    try:
        running = start(plan, service.step, job, hosts, run_dir, env)
    except UnsetVariable as unset:
        print(unset_line(unset, service.step.name, socket.gethostname()), flush=True)
        return False
    host = step_hosts(plan, service.step, hosts)[0]
    address = f"{host}:{service.port}"
    env[service.address_env] = address
    print(f"clusterkit: waiting up to {service.ready_timeout_s} s for the service at {address}", flush=True)
    why = wait_until_ready(host, service.port, service.ready_timeout_s, running)
    if why is not None:
        print(f"clusterkit: the service at {address} did not answer ({why}): not training", flush=True)
        running.stop()
        print("clusterkit: service stopped", flush=True)
        return False
    print(f"clusterkit: the service answers at {address}", flush=True)
    return running

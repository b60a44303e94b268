"""launcher: ray: the plan's Ray steps, from the resolved recipe. The head's step on the first
training node, the workers' on the others, each task a ``ray start`` (through the supervisor's
``ray-node``) declaring the node's CPUs and GPUs from the allocation, with the recipe's
launcher_args after clusterkit's options; the driver is the launch step (:mod:`.launchers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterkit.spec import layout
from clusterkit.spec.launchers import Words
from clusterkit.spec.step_options import step_options
from clusterkit.supervisor.plan import RayCluster, Step
from clusterkit.supervisor.run_files import RAY_DIR

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

READY_TIMEOUT_S = 300  # the head answering, then every worker joined
# The check the driver waits for, run in the batch shell with the job's Python: exit 0 once Ray at
# ADDRESS reports COUNT nodes alive, 1 if not within TIMEOUT seconds (as ray symmetric-run waits).
READY_CHECK = """import sys, time
import ray
address, count, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ray.init(address=address, log_to_driver=False, configure_logging=False)
started = time.monotonic()
while True:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    if alive >= count:
        print(f"clusterkit: Ray has all {count} nodes", flush=True)
        sys.exit(0)
    if time.monotonic() - started >= limit:
        print(f"clusterkit: {alive} of {count} Ray nodes joined within {limit:g} s", flush=True)
        sys.exit(1)
    time.sleep(1.0)
"""


def _node_step(recipe: ResolvedRecipe, profile: ClusterProfile, role: str, hosts: str, nodes: int) -> Step:
    command = (
        Words()
        .add(*recipe.python)
        .runtime("{run_dir}/" + layout.SUPERVISOR_DIR)
        .add(
            "ray-node",
            role,
            f"--num-cpus={recipe.resources.cpus_per_task}",  # one task per node: the node's CPUs
            f"--num-gpus={recipe.resources.gpus_per_node}",
        )
        .given(*recipe.launcher_args)
    )
    return Step(
        name=f"ray-{role}",
        hosts=hosts,
        nodes=nodes,
        tasks_per_node=1,
        argv=tuple(command.words),
        expand=tuple(command.expand),
        srun=tuple(step_options(recipe, profile)),
        logs=(f"{RAY_DIR}/{role}_%t.out", f"{RAY_DIR}/{role}_%t.err"),  # head_0, worker_0 ...
        # Ray's processes start with the preemption signal ignored: the driver gets it, and Ray is
        # stopped once the driver ends.
        signal_to_launcher=False,
    )


def ray_cluster(recipe: ResolvedRecipe, profile: ClusterProfile) -> RayCluster | None:
    if recipe.launcher != "ray":
        return None
    nodes = recipe.resources.nodes
    return RayCluster(
        head=_node_step(recipe, profile, "head", "first", 1),
        workers=_node_step(recipe, profile, "worker", "rest", nodes - 1) if nodes > 1 else None,
        check=(*recipe.python, "-c", READY_CHECK),
        ready_timeout_s=READY_TIMEOUT_S,
    )

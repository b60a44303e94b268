"""The plan's steps and the container they enter: a step's record built from its words and srun
options around the recipe's container runtime (pyxis's srun options, or every other runtime's
command before the program: spec.containers), the variables such a container is given, enroot's
make/remove steps (spec.enroot) and the runtime command the hooks run under (hooks.in_container).
Used by the launch plan (spec.launch_plan) and a heterogeneous job's components."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterkit.spec import containers, enroot, layout
from clusterkit.spec.launchers import Words
from clusterkit.spec.sbatch_header import total_nodes
from clusterkit.supervisor.plan import ContainerSetup, Step

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

RUN_DIR = "{run_dir}"


@dataclass(frozen=True)
class Container:
    """How the steps enter the recipe's container: pyxis takes srun options (and the node agent runs
    inside, with the image's Python: the profile's container.python); every other runtime is a
    command before the program (the node agent runs outside and starts it: spec.containers). The
    run directory is always mounted at its own path."""

    srun: Words
    prefix: Words
    agent_python: tuple[str, ...]


def container(
    recipe: ResolvedRecipe, profile: ClusterProfile, step: str = "launch", env: tuple[str, ...] = ()
) -> Container:
    """``step`` names a docker/podman container, with the job id and (but for the image check, one
    task without the node agent) the srun task's id (a node's, or a rank's where a task is one): a
    site's epilog can remove one that a killed client left behind (``docker rm -f``). ``env``: the
    names such a container is given."""
    box = recipe.container
    if box is None:
        return Container(Words(), Words(), ())
    if box.runtime == "pyxis":
        srun = (
            Words()
            .given(f"--container-image={box.image}")
            .runtime(f"--container-mounts={''.join(mount + ',' for mount in box.mounts)}{RUN_DIR}:{RUN_DIR}")
        )
        if box.workdir:
            srun.given(f"--container-workdir={box.workdir}")
        return Container(srun, Words(), (box.python,))
    # srun's task id; the image check and the hooks are one process, without it.
    name = f"clusterkit-{{job_id}}-{step}" + ("" if step in ("image-check", "hooks") else "-{rank}")
    return Container(Words(), containers.prefix(box, profile, name, env), ())


def plan_step(
    name: str, hosts: str, nodes: int, per_node: int, command: Words, box: Container, srun: list[str], **fields: Any
) -> Step:
    """A step's record: ``command`` after the container's prefix, ``srun`` after its srun options."""
    argv = Words().extend(box.prefix).extend(command)
    options = Words().extend(box.srun)
    options.add(*srun)
    return Step(
        name=name,
        hosts=hosts,
        nodes=nodes,
        tasks_per_node=per_node,
        argv=tuple(argv.words),
        expand=tuple(argv.expand),
        srun=tuple(options.words),
        srun_expand=tuple(options.expand),
        agent_python=box.agent_python,
        **fields,
    )


def container_setup(recipe: ResolvedRecipe) -> ContainerSetup | None:
    """enroot's import (a registry image), create and remove, as one-task-per-node steps (spec.enroot)."""
    box = recipe.container
    if box is None or containers.RUNTIMES[box.runtime].style != "enroot":
        return None
    life = enroot.lifecycle(box, RUN_DIR)
    logs = (
        layout.node_log(layout.JOB_ID_PATTERN[recipe.job_kind], "%t", "out"),
        layout.node_log(layout.JOB_ID_PATTERN[recipe.job_kind], "%t", "err"),
    )

    def once(name: str, hosts: str, nodes: int, words: Words) -> Step:
        return plan_step(
            name, hosts, nodes, 1, words, Container(Words(), Words(), ()), ["--cpus-per-task=1"], logs=logs, agent=False
        )

    nodes = total_nodes(recipe)
    return ContainerSetup(
        create=once("enroot-create", "all", nodes, life.create),
        remove=once("enroot-remove", "all", nodes, life.remove),
        import_=once("enroot-import", "first", 1, life.import_) if life.import_ else None,
        imported=life.imported,
    )


def hooks_container(recipe: ResolvedRecipe, profile: ClusterProfile, passed: tuple[str, ...]) -> Step | None:
    """hooks.in_container: the runtime's command (the tasks' own) that the hook lines' bash runs under,
    here in the batch shell; a docker/podman container is also given post_run's exit code. pyxis's
    are srun's options: one task on the allocation's first node, the batch shell's, in the image."""
    if not recipe.hooks.in_container or recipe.container is None:
        return None
    box = container(recipe, profile, "hooks", (*passed, "CLUSTERKIT_EXIT_CODE"))
    run = box.prefix
    if box.srun.words:
        run = Words().add("srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1").extend(box.srun)
    return plan_step("hooks", "batch", 1, 1, run, Container(Words(), Words(), ()), [], agent=False)

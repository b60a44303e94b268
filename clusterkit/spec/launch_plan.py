"""The launch plan, computed once from the resolved recipe and profile (pure, no I/O): every step the
job runs (the image check, the service, the preflight, the launch) with its hosts, tasks per node,
command and environment, and what the job does about preemption and failures. Render writes it as
``plan.json`` and the job's supervisor (:mod:`clusterkit.supervisor`) carries it out; every count
the job uses comes from here. The srun options a step gets are :mod:`clusterkit.spec.step_options`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec

from clusterkit.spec import components as het
from clusterkit.spec import containers, layout
from clusterkit.spec.container_steps import (
    RUN_DIR,
    Container,
    container,
    container_setup,
    hooks_container,
    plan_step,
)
from clusterkit.spec.launchers import BATCH_LAUNCHER, LAUNCHERS, Program, Words
from clusterkit.spec.network import env_value
from clusterkit.spec.profiling import nsys_wrapper
from clusterkit.spec.ray_cluster import ray_cluster
from clusterkit.spec.runtime_values import placeholders
from clusterkit.spec.sbatch_header import tasks_per_node
from clusterkit.spec.step_options import step_options
from clusterkit.spec.watchdog import seconds
from clusterkit.supervisor.plan import Component, LaunchPlan, Notify, Recovery, Service, Step, Watchdog

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe, ResolvedStep

# The steps the plan builds itself (a job of several steps may not name one of its own so).
STEP_NAMES = ("launch", "preflight", "service", "image-check")
# The check run in the image before anything starts: the Python packages the launch needs, by name.
IMAGE_CHECK = (
    "import importlib.util, sys; missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; "
    "missing and sys.exit('clusterkit: the container image has no Python package ' + ', '.join(missing))"
)


def program(recipe: ResolvedRecipe, module: str | None = None) -> Program:
    """What the ranks run: ``module`` (clusterkit's, given the job file), the built-in runner (under
    nsys with profile: kind nsys), or the recipe's script (from the code snapshot in the run
    directory where there is one) or program."""
    job_file = Words().runtime(f"{RUN_DIR}/{layout.JOB_JSON}")
    task = recipe.task
    if module is not None:
        return Program(Words().add(module), True, job_file)
    if task.trainer is not None:
        nsys = recipe.profile is not None and recipe.profile.kind == "nsys"
        wrapper = nsys_wrapper() if nsys else Words()
        return Program(Words().add("clusterkit.runtime.runner"), True, job_file, wrapper)
    # A program is run as written (a path relative to the submit directory, the job's working
    # directory; a bare name from PATH), never from a snapshot (load.snapshot takes none for it).
    entry = Words().add(task.program or task.script)  # type: ignore[arg-type]
    if recipe.snapshot is not None:  # an array task's copy is in the array's directory, one up
        up = "/.." if recipe.job_kind == "array" else ""
        entry = Words().runtime(f"{RUN_DIR}{up}/{layout.SNAPSHOT_DIR}/{recipe.snapshot.script}")
    return Program(entry, task.module, Words().given(*task.args))


def image_needs(recipe: ResolvedRecipe) -> list[str]:
    """The Python packages an image must hold for this job's launch to start."""
    needs = [LAUNCHERS[recipe.launcher].package]
    if recipe.task.trainer is not None or recipe.preflight.enabled:
        needs += ["torch", "transformers", "clusterkit"]  # the built-in runner and the preflight are clusterkit's
    return sorted({need for need in needs if need})


def _ranks_step(
    name: str, recipe: ResolvedRecipe, profile: ClusterProfile, run: Program, box: Container, late_env: tuple[str, ...]
) -> Step:
    """A step that starts the ranks: one task per node (or per rank) running the launcher's command,
    or, for a launcher in the batch shell, that launcher here."""
    launcher = LAUNCHERS[recipe.launcher]
    if launcher.replaces_agent and run.module:  # clusterkit's own ranks (the preflight): the same tasks, in Python
        launcher = LAUNCHERS["python"]
    kind = recipe.job_kind
    logs = (
        layout.node_log(layout.JOB_ID_PATTERN[kind], "%t", "out"),
        layout.node_log(layout.JOB_ID_PATTERN[kind], "%t", "err"),
    )
    env = step_env(recipe)
    if recipe.process_model == BATCH_LAUNCHER or launcher.command is None:  # ray: its driver
        rank = (
            Program(
                Words()
                .runtime(f"{RUN_DIR}/{layout.SUPERVISOR_DIR}/__main__.py")
                .add("rank", *(["--module"] if run.module else []))
                .extend(run.entry),
                False,
                run.args,
            )
            if launcher.batch_ranks
            else run
        )
        command = launcher.batch_command(recipe, rank)  # type: ignore[misc]
        srun = step_options(recipe, profile) if launcher.name == "deepspeed" else []
        at = command.words.index(RUN_DIR + "/" + layout.SUPERVISOR_DIR + "/__main__.py") if srun else -1
        once = recipe.process_model != BATCH_LAUNCHER  # ray's driver: one process, not the ranks
        return plan_step(
            name,
            "batch",
            1 if once else recipe.resources.nodes,
            1 if once else recipe.ranks_per_node,
            command,
            Container(Words(), Words(), ()),
            srun,
            logs=logs,
            env=env,
            env_expand=late_env + tuple(name for name in env if placeholders(env[name])),
            ranks="none",
            agent=False,
            srun_flag="--launcher_args=" if srun else "",
            srun_at=at,
        )
    return plan_step(
        name,
        "train",
        recipe.resources.nodes,
        tasks_per_node(recipe),
        launcher.command(recipe, run),
        box,  # type: ignore[misc]
        step_options(recipe, profile),
        logs=logs,
        env=env,
        env_expand=late_env,
        ranks=launcher.ranks,
        signal_to_launcher=launcher.signal_to_launcher,
        replace=launcher.replaces_agent,
    )


def as_step(recipe: ResolvedRecipe, step: ResolvedStep) -> ResolvedRecipe:
    """The recipe as one of its steps runs: the step's task, launcher, options and nodes. A step
    with fewer tasks per node than the allocation (a program once per node beside a task per rank)
    gets the node's CPUs shared among its tasks."""
    runs = msgspec.structs.replace(
        recipe,
        task=step.task,
        steps=None,
        launcher=step.launcher,
        process_model=step.process_model,
        launcher_args=step.launcher_args,
        srun=step.srun,
        resources=msgspec.structs.replace(recipe.resources, nodes=step.nodes),
    )
    cpus = recipe.resources.cpus_per_task * (recipe.tasks_per_node // runs.tasks_per_node)
    return msgspec.structs.replace(runs, resources=msgspec.structs.replace(runs.resources, cpus_per_task=cpus))


def job_steps(
    recipe: ResolvedRecipe, profile: ClusterProfile, box: Container, late_env: tuple[str, ...]
) -> tuple[Step, ...]:
    """A job of several steps: each built as the launch step would be for the recipe as the step
    runs, with its logs in ``steps/<name>/`` (``steps/<name>/{trial}/`` for trials) and its env
    values beside the recipe's (their run-time values filled in by the node agent)."""
    built = []
    for step in recipe.steps or []:
        runs = as_step(recipe, step)
        launch = _ranks_step(step.name, runs, profile, program(runs), box, late_env)
        folder = layout.step_dir(step.name, "{trial}" if step.repeat > 1 else None)
        env = {name: env_value(value) for name, value in step.env.items()}
        built.append(
            dataclasses.replace(
                launch,
                logs=(f"{folder}/{launch.logs[0]}", f"{folder}/{launch.logs[1]}"),
                env={**launch.env, **env},
                env_expand=(*launch.env_expand, *sorted(name for name, value in env.items() if placeholders(value))),
                repeat=step.repeat,
            )
        )
    return tuple(built)


def step_env(recipe: ResolvedRecipe) -> dict[str, str]:
    """What a launch step's tasks are told of the layout beyond SLURM's own variables."""
    if recipe.launcher == "command":  # your command starts the node's ranks (in the batch shell: all of them)
        env = {
            "NNODES": str(recipe.resources.nodes),
            "GPUS_PER_NODE": str(recipe.ranks_per_node),
            "WORLD_SIZE": str(recipe.world_size),
        }
        if recipe.process_model == BATCH_LAUNCHER:  # the training hosts, as the supervisor wrote them
            env["CLUSTERKIT_HOSTFILE"] = f"{RUN_DIR}/{layout.HOSTFILE}"
        return env
    if recipe.process_model == "task_per_gpu":
        return {"WORLD_SIZE": str(recipe.world_size), "LOCAL_WORLD_SIZE": str(recipe.ranks_per_node)}
    if recipe.launcher == "mpirun":  # its daemons' srun gets the node's CPUs (srun no longer inherits them)
        return {"SRUN_CPUS_PER_TASK": str(recipe.resources.cpus_per_task * recipe.ranks_per_node)}
    return {}


def container_env(recipe: ResolvedRecipe, env_names: tuple[str, ...]) -> tuple[str, ...]:
    """The variables a docker/podman container is given by name: SLURM's, the ranks' and clusterkit's
    (spec.containers.PASSED_ENV), the job's environment lines (``env_names``), the launch step's
    layout variables, the secrets and the service's address."""
    service = (recipe.service.address_env,) if recipe.service else ()
    job = {*env_names, *step_env(recipe), *recipe.secrets, *service} - set(containers.PASSED_ENV)
    return (*containers.PASSED_ENV, *sorted(job))  # sorted: the same words however env.sh orders its lines


def launch_plan(
    recipe: ResolvedRecipe,
    profile: ClusterProfile,
    late_env: tuple[str, ...] = (),
    rank_files: tuple[str, ...] = (),
    env_names: tuple[str, ...] = (),
) -> LaunchPlan:
    """The plan. ``late_env``: the names of env values that hold a node's or a rank's run-time
    values (the node agent fills them in); ``rank_files``: the rendered files the ranks read;
    ``env_names``: every variable the job's environment lines set (a docker container is given each)."""
    passed = container_env(recipe, env_names)
    box = container(recipe, profile, "launch", passed)
    # A job of several steps: the packages each step's launch needs.
    each = [recipe, *(as_step(recipe, step) for step in recipe.steps or [])]
    needs = sorted({need for runs in each for need in image_needs(runs)})
    image_check = None
    # Checked in the image before anything starts: the packages the launch imports, with the launch's
    # interpreter; where nothing is imported, only that the node agent's interpreter is there (pyxis).
    if recipe.container is not None and (needs or box.agent_python):
        check = Words().add(*(recipe.python if needs else box.agent_python), "-c", IMAGE_CHECK, *needs)
        image_check = plan_step(
            "image-check",
            "first",
            1,
            1,
            check,
            container(recipe, profile, "image-check", passed),
            ["--cpus-per-task=1"],
            logs=(
                layout.node_log(layout.JOB_ID_PATTERN[recipe.job_kind], "%t", "out"),
                layout.node_log(layout.JOB_ID_PATTERN[recipe.job_kind], "%t", "err"),
            ),
            agent=False,
        )
    service = None
    if recipe.service is not None:
        spec = recipe.service
        # The whole node's CPUs, whatever the launch's tasks per node: the service is one process per node.
        cpus = recipe.resources.cpus_per_task * tasks_per_node(recipe)
        step = plan_step(
            "service",
            "service",
            spec.nodes,
            1,
            Words().add(*spec.command),
            container(recipe, profile, "service", passed),
            [f"--cpus-per-task={cpus}"],
            logs=(layout.service_log("%t", "out"), layout.service_log("%t", "err")),
            signal_to_launcher=False,
        )
        service = Service(step=step, port=spec.port, ready_timeout_s=spec.ready_timeout_s, address_env=spec.address_env)
    preflight = None
    if recipe.preflight.enabled:
        preflight = _ranks_step(
            "preflight",
            recipe,
            profile,
            program(recipe, "clusterkit.runtime.preflight"),
            container(recipe, profile, "preflight", passed),
            late_env,
        )
    excluded = recipe.resources.extra_sbatch.get("exclude")
    return LaunchPlan(
        job_name=recipe.name,
        job_kind=recipe.job_kind,
        train_nodes=recipe.resources.nodes,
        service_nodes=recipe.service.nodes if recipe.service else 0,
        spare_nodes=recipe.resources.spare_nodes,
        slots_per_node=recipe.ranks_per_node,
        master_port=recipe.master_port,
        rank_files=rank_files,
        image_check=image_check,
        service=service,
        preflight=preflight,
        preflight_only=recipe.preflight.only,
        launch=_ranks_step("launch", recipe, profile, program(recipe), box, late_env),
        recovery=Recovery(
            signal=recipe.preemption.handled_signal,
            max_requeues=recipe.preemption.max_requeues,
            max_retries=recipe.preemption.max_retries,
            exclude=tuple(excluded.split(",")) if isinstance(excluded, str) else (),
            slow_nodes_excluded=recipe.preflight.on_slow == "exclude",
            max_restarts=recipe.resources.spare_nodes
            if recipe.preemption.max_restarts is None
            else recipe.preemption.max_restarts,
        ),
        pre_launch=tuple(recipe.hooks.pre_launch),
        post_run=tuple(recipe.hooks.post_run),
        # Only a single job's end is the run's: an array's tasks share the file, a chain's links read it in turn.
        secrets_file=layout.SECRETS_FILE if recipe.secrets and recipe.job_kind == "job" else None,
        secrets=tuple(recipe.secrets),
        watchdog=Watchdog(
            seconds(recipe.watchdog.no_progress), seconds(recipe.watchdog.startup), recipe.watchdog.action
        )
        if recipe.watchdog
        else None,
        notify=Notify(recipe.notify.webhook_secret, tuple(recipe.notify.events), recipe.notify.format)
        if recipe.notify and recipe.notify.webhook_secret
        else None,
        steps=job_steps(recipe, profile, box, late_env),
        container_setup=container_setup(recipe),
        hooks_container=hooks_container(recipe, profile, passed),
        components=components(recipe),
        ray=ray_cluster(recipe, profile),
    )


def components(recipe: ResolvedRecipe) -> tuple[Component, ...]:
    """A heterogeneous job's components: each command once per rank on its own het group's nodes,
    exec'd by the node agent once RANK, LOCAL_RANK, WORLD_SIZE (the component's) are set."""
    planned = []
    for component in recipe.components or []:
        cpus = [] if component.cpus_per_task is None else [f"--cpus-per-task={component.cpus_per_task}"]
        srun = cpus + [
            f"--{flag}" if value is True else f"--{flag}={value}"
            for flag, value in sorted(component.srun.items())
            if value is not False
        ]
        step = plan_step(
            component.name,
            "component",
            component.nodes,
            component.ranks_per_node,
            Words().add(*component.command),
            Container(Words(), Words(), ()),
            srun,
            logs=(het.component_log(component.name, "%t", "out"), het.component_log(component.name, "%t", "err")),
            env={name: env_value(value) for name, value in component.env.items()},
            ranks="task",
            replace=True,
            het_group=het.het_group(recipe, component.name),
        )
        planned.append(Component(component.name, step, component.port, component.ready_timeout_s))
    return tuple(planned)

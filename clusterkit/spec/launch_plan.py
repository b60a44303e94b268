"""The launch plan, computed once from the resolved recipe and profile (pure, no I/O): every step the
job runs (the image check, the service, the preflight, the launch) with its hosts, tasks per node,
command and environment, and what the job does about preemption and failures. Render writes it as
``plan.json`` and the job's supervisor (:mod:`clusterkit.supervisor`) carries it out; every count
the job uses comes from here.

The options the launch step's srun gets are a table (:data:`STEP_OPTIONS`) and, with the layout the
supervisor writes (:data:`STEP_LAYOUT`), the view :data:`STEP_OWNED` the recipe checks read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from clusterkit.spec import layout
from clusterkit.spec.launchers import BATCH_LAUNCHER, LAUNCHERS, Program, Words
from clusterkit.spec.network import env_value
from clusterkit.spec.profiling import nsys_wrapper
from clusterkit.spec.runtime_values import placeholders
from clusterkit.spec.sbatch_header import tasks_per_node
from clusterkit.spec.watchdog import seconds
from clusterkit.supervisor.plan import LaunchPlan, Notify, Recovery, Service, Step, Watchdog

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe, ResolvedStep

RUN_DIR = "{run_dir}"
# The steps the plan builds itself (a job of several steps may not name one of its own so).
STEP_NAMES = ("launch", "preflight", "service", "image-check")
_LOGS = "runs_dir (each node's log is in the run directory)"


@dataclass(frozen=True)
class StepOption:
    flag: str
    field: str
    value: Callable[[ResolvedRecipe, ClusterProfile], Any]  # None: not given; True: the flag alone


STEP_OPTIONS: tuple[StepOption, ...] = (
    StepOption("kill-on-bad-exit", "srun.kill_on_bad_exit", lambda r, p: 1 if r.srun.kill_on_bad_exit else 0),
    # Given explicitly: since SLURM 22.05 srun no longer inherits it from the allocation, and a node's
    # launcher, ranks and data loaders would share one core.
    StepOption("cpus-per-task", "resources.cpus_per_task", lambda r, p: r.resources.cpus_per_task),
    # The profile's GPU binding goes only to a step whose every task is one rank.
    StepOption(
        "gpu-bind",
        "the cluster profile's task_gpu_bind",
        lambda r, p: p.task_gpu_bind if r.process_model != "launcher_per_node" else None,
    ),
    StepOption("wait", "srun.wait", lambda r, p: r.srun.wait),
    StepOption("mpi", "srun.mpi", lambda r, p: r.srun.mpi),
    StepOption("distribution", "srun.distribution", lambda r, p: r.srun.distribution),
    StepOption("cpu-bind", "srun.cpu_bind", lambda r, p: r.srun.cpu_bind),
    StepOption("label", "srun.label", lambda r, p: True if r.srun.label else None),
)
# What the supervisor gives every step (clusterkit.supervisor.steps.srun_argv) -> the field behind it.
STEP_LAYOUT = {
    "nodes": "resources.nodes",
    "ntasks": "resources.nodes and process_model",
    "ntasks-per-node": "process_model (a launcher task per node, or a task per rank)",
    "nodelist": "resources.nodes (training on the allocation's first nodes, a service on the last)",
    "output": _LOGS,
    "error": _LOGS,
    "open-mode": "nothing: the node logs are appended to",
}
STEP_OWNED = {**STEP_LAYOUT, **{option.flag: option.field for option in STEP_OPTIONS}}

# The check run in the image before anything starts: the Python packages the launch needs, by name.
IMAGE_CHECK = (
    "import importlib.util, sys; missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; "
    "missing and sys.exit('clusterkit: the container image has no Python package ' + ', '.join(missing))"
)


def step_options(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[str]:
    """The launch step's srun options (and the preflight's), then the recipe's srun.extra."""
    words = []
    for option in STEP_OPTIONS:
        value = option.value(recipe, profile)
        if value is not None:
            words.append(f"--{option.flag}" if value is True else f"--{option.flag}={value}")
    words += [
        f"--{flag}" if value is True else f"--{flag}={value}"
        for flag, value in sorted(recipe.srun.extra.items())
        if value is not False
    ]
    return words


@dataclass(frozen=True)
class Container:
    """How the steps enter the recipe's container: pyxis takes srun options (and the node agent runs
    inside, with the image's Python: the profile's container.python); Apptainer is a command before
    the program (the node agent runs outside and starts it). The run directory is always mounted at
    its own path."""

    srun: Words
    prefix: Words
    agent_python: tuple[str, ...]


def container(recipe: ResolvedRecipe, profile: ClusterProfile) -> Container:
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
    gpus = {"nvidia": ["--nv"], "amd": ["--rocm"]}.get(profile.gpu_vendor, []) if profile.accelerator == "gpu" else []
    prefix = (
        Words()
        .add("apptainer", "exec", *gpus, "--bind")
        .runtime("".join(mount + "," for mount in box.mounts) + RUN_DIR)
    )
    if box.workdir:
        prefix.add("--pwd").given(box.workdir)
    return Container(Words(), prefix.given(box.image), ())


def program(recipe: ResolvedRecipe, module: str | None = None) -> Program:
    """What the ranks run: ``module`` (clusterkit's, given the job file), the built-in runner (under
    nsys with profile: kind nsys), or the recipe's script (from the code snapshot in the run
    directory where there is one)."""
    job_file = Words().runtime(f"{RUN_DIR}/{layout.JOB_JSON}")
    task = recipe.task
    if module is not None:
        return Program(Words().add(module), True, job_file)
    if task.trainer is not None:
        nsys = recipe.profile is not None and recipe.profile.kind == "nsys"
        wrapper = nsys_wrapper() if nsys else Words()
        return Program(Words().add("clusterkit.runtime.runner"), True, job_file, wrapper)
    entry = Words().add(task.script)  # type: ignore[arg-type]
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


def _step(
    name: str, hosts: str, nodes: int, per_node: int, command: Words, box: Container, srun: list[str], **fields: Any
) -> Step:
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


def _ranks_step(
    name: str, recipe: ResolvedRecipe, profile: ClusterProfile, run: Program, box: Container, late_env: tuple[str, ...]
) -> Step:
    """A step that starts the ranks: one task per node (or per rank) running the launcher's command,
    or, for a launcher in the batch shell, that launcher here."""
    launcher = LAUNCHERS[recipe.launcher]
    kind = recipe.job_kind
    logs = (
        layout.node_log(layout.JOB_ID_PATTERN[kind], "%t", "out"),
        layout.node_log(layout.JOB_ID_PATTERN[kind], "%t", "err"),
    )
    env = step_env(recipe)
    if recipe.process_model == BATCH_LAUNCHER:
        rank = Program(
            Words()
            .runtime(f"{RUN_DIR}/{layout.SUPERVISOR_DIR}/__main__.py")
            .add("rank", *(["--module"] if run.module else []))
            .extend(run.entry),
            False,
            run.args,
        )
        command = launcher.batch_command(recipe, rank)  # type: ignore[misc]
        srun = step_options(recipe, profile) if launcher.name == "deepspeed" else []
        at = command.words.index(RUN_DIR + "/" + layout.SUPERVISOR_DIR + "/__main__.py") if srun else -1
        return _step(
            name,
            "batch",
            recipe.resources.nodes,
            recipe.ranks_per_node,
            command,
            Container(Words(), Words(), ()),
            srun,
            logs=logs,
            env=env,
            env_expand=late_env,
            ranks="none",
            agent=False,
            srun_flag="--launcher_args=" if srun else "",
            srun_at=at,
        )
    return _step(
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
    if recipe.launcher == "command":  # your command starts the node's ranks
        return {
            "NNODES": str(recipe.resources.nodes),
            "GPUS_PER_NODE": str(recipe.ranks_per_node),
            "WORLD_SIZE": str(recipe.world_size),
        }
    if recipe.process_model == "task_per_gpu":
        return {"WORLD_SIZE": str(recipe.world_size), "LOCAL_WORLD_SIZE": str(recipe.ranks_per_node)}
    if recipe.launcher == "mpirun":  # its daemons' srun gets the node's CPUs (srun no longer inherits them)
        return {"SRUN_CPUS_PER_TASK": str(recipe.resources.cpus_per_task * recipe.ranks_per_node)}
    return {}


def launch_plan(
    recipe: ResolvedRecipe, profile: ClusterProfile, late_env: tuple[str, ...] = (), rank_files: tuple[str, ...] = ()
) -> LaunchPlan:
    """The plan. ``late_env``: the names of env values that hold a node's or a rank's run-time
    values (the node agent fills them in); ``rank_files``: the rendered files the ranks read."""
    box = container(recipe, profile)
    # A job of several steps: the packages each step's launch needs.
    each = [recipe, *(as_step(recipe, step) for step in recipe.steps or [])]
    needs = sorted({need for runs in each for need in image_needs(runs)})
    image_check = None
    # Checked in the image before anything starts: the packages the launch imports, with the launch's
    # interpreter; where nothing is imported, only that the node agent's interpreter is there (pyxis).
    if recipe.container is not None and (needs or box.agent_python):
        check = Words().add(*(recipe.python if needs else box.agent_python), "-c", IMAGE_CHECK, *needs)
        image_check = _step(
            "image-check",
            "first",
            1,
            1,
            check,
            box,
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
        step = _step(
            "service",
            "service",
            spec.nodes,
            1,
            Words().add(*spec.command),
            box,
            [f"--cpus-per-task={cpus}"],
            logs=(layout.service_log("%t", "out"), layout.service_log("%t", "err")),
            signal_to_launcher=False,
        )
        service = Service(step=step, port=spec.port, ready_timeout_s=spec.ready_timeout_s, address_env=spec.address_env)
    preflight = None
    if recipe.preflight.enabled:
        preflight = _ranks_step(
            "preflight", recipe, profile, program(recipe, "clusterkit.runtime.preflight"), box, late_env
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
    )

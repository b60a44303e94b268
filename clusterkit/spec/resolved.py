"""The resolved recipe: every value the profile fills or the layout derives is set, so nothing that
runs a job needs a fallback. The loader builds one from a :class:`~clusterkit.spec.recipe.Recipe` as
written; the job reads it back from ``job.json`` as a :class:`JobFile`.

Field names and order are those of the recipe as written: ``recipe.resolved.yaml`` lists them in
this order and ``job.json`` holds them under the same keys.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from clusterkit.spec.components import Component
from clusterkit.spec.job_steps import step_recipe, training_step
from clusterkit.spec.notify import Notify, notify_secrets
from clusterkit.spec.profile import ClusterProfile, Container
from clusterkit.spec.profiling import Profiling
from clusterkit.spec.recipe import (
    SLURM_TIME_PATTERN,
    AccelerateSettings,
    DeepSpeedSettings,
    EnvMap,
    Fsdp,
    Hooks,
    Launcher,
    Line,
    MemoryText,
    Name,
    NetworkProfileName,
    NonEmptyLine,
    Offload,
    Parallelism,
    Precision,
    Preemption,
    Preflight,
    ProcessModel,
    ProfileDrops,
    PythonCommand,
    Recipe,
    Rendezvous,
    Resources,
    SbatchFlag,
    SbatchValue,
    Service,
    Srun,
    StepEnvValue,
    Sweep,
    SweepValue,
    Task,
    _Struct,
    process_model_of,
    tasks_per_node,
)
from clusterkit.spec.snapshot import CodeSnapshot
from clusterkit.spec.tracking import Tracking, as_tracking
from clusterkit.spec.watchdog import Duration, Watchdog

DEFAULT_RUNS_DIR = "./runs"


class ResolvedResources(_Struct):
    nodes: int
    spare_nodes: int
    gpus_per_node: int
    cpus_per_task: int
    mem: MemoryText | None  # always text, as for time
    # Always text: a number of minutes written as 60 becomes "60", as SLURM reads it.
    time: Annotated[str, Meta(pattern=SLURM_TIME_PATTERN)] | None
    partition: NonEmptyLine | None
    account: NonEmptyLine | None
    qos: NonEmptyLine | None
    constraint: NonEmptyLine | None
    reservation: NonEmptyLine | None
    exclusive: bool
    time_min: Annotated[str, Meta(pattern=SLURM_TIME_PATTERN)] | None
    wait_all_nodes: bool
    extra_sbatch: dict[SbatchFlag, SbatchValue]


class ResolvedParallelism(_Struct):
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero_stage: int
    offload_optimizer: Offload
    offload_params: Offload
    micro_batch_size: int
    global_batch_size: int
    gradient_accumulation_steps: int
    fsdp: Fsdp | None


class ResolvedNetwork(_Struct):
    profile: NetworkProfileName
    env: EnvMap
    debug: bool


class ResolvedStep(_Struct):
    """One of a job's steps with the recipe's defaults filled in (spec.recipe.JobStep)."""

    name: Name
    task: Task
    launcher: Launcher
    process_model: ProcessModel
    launcher_args: list[str]
    srun: Srun
    env: dict[str, StepEnvValue]  # as written: the plan makes them text (spec.network.env_value)
    nodes: int
    repeat: int


class ArrayPlacement(_Struct):
    """Where a job sits in a SLURM job array: every task of ``spec`` runs this recipe (resources.array),
    or, in a sweep, task ``point`` does, with the grid's ``values``. Each task's run directory is
    ``<runs_dir>/<name>/<array id>/<task id>/``."""

    spec: str  # sbatch --array
    point: int | None = None
    values: dict[str, SweepValue] = msgspec.field(default_factory=dict)
    # A chain (submit --chain N): the tasks are links run one at a time (%1) in ONE run directory,
    # <runs_dir>/<name>/<array id>/, each continuing the run from its newest complete checkpoint.
    chain: bool = False


class ResolvedRecipe(_Struct, kw_only=True):
    name: Name
    cluster: NonEmptyLine
    description: str | None
    resources: ResolvedResources
    parallelism: ResolvedParallelism
    launcher: Launcher
    process_model: ProcessModel
    launcher_args: list[str]
    rendezvous: Rendezvous
    precision: Precision
    task: Task  # with steps: the training step's (spec.job_steps.training_step)
    steps: list[ResolvedStep] | None
    network: ResolvedNetwork
    deepspeed: DeepSpeedSettings
    accelerate: AccelerateSettings
    preemption: Preemption
    preflight: Preflight
    env: EnvMap
    secrets: list[str]  # names only (spec.secrets); the webhook's too (spec.notify)
    setup: list[Line]
    srun: Srun
    service: Service | None
    components: list[Component] | None = None  # spec.components (a heterogeneous job)
    watchdog: Watchdog | None
    notify: Notify | None
    collective_timeout: Duration | None  # spec.collective_timeout
    profile: Profiling | None
    container: Container | None  # the profile's, with the recipe's image where it names one
    hooks: Hooks
    drop: ProfileDrops
    runs_dir: NonEmptyLine
    master_port: int | None
    python: list[NonEmptyLine]
    resume_from: NonEmptyLine | None
    sweep: Sweep | None  # as written: a recipe with one is submitted as its points (load.sweep)
    array: ArrayPlacement | None
    tracking: Tracking
    snapshot: CodeSnapshot | None = None  # filled by load.snapshot: the code the job runs from

    @property
    def job_kind(self) -> str:
        """``job``; ``array``: a task per index, each in its own run directory; ``chain``: links one
        after another in one run directory (spec.layout names each kind's directories)."""
        return "job" if self.array is None else "chain" if self.array.chain else "array"

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU (on a CPU cluster, per process standing in for one)."""
        return self.resources.gpus_per_node

    @property
    def tasks_per_node(self) -> int:
        return tasks_per_node(self.process_model, self.ranks_per_node)

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.gpus_per_node

    @property
    def uses_deepspeed(self) -> bool:
        if self.deepspeed.enabled is not None:
            return self.deepspeed.enabled
        # The built-in runner applies tp through DeepSpeed AutoTP.
        autotp = self.task.trainer is not None and self.parallelism.tp > 1
        return self.launcher == "deepspeed" or self.parallelism.zero_stage > 0 or autotp


class JobFile(_Struct):
    """``job.json``: what every rank of a job reads."""

    recipe: ResolvedRecipe
    profile: ClusterProfile


def python_argv(command: PythonCommand) -> list[str]:
    """The interpreter as an argv list: `python3` → [python3]; a list is already one."""
    return [command] if isinstance(command, str) else list(command)


def resolve_resources(
    r: Resources, profile: ClusterProfile, process_model: str = "launcher_per_node"
) -> ResolvedResources:
    """The resources with every field the recipe left open filled from the profile (the recipe wins).
    cpus_per_task is per srun task: a node's launcher gets the node's CPUs, a task per GPU its share."""
    gpus_per_node = r.gpus_per_node or profile.gpus_per_node
    tasks = tasks_per_node(process_model, gpus_per_node)
    mem = r.mem if r.mem is not None else profile.mem_per_node
    return ResolvedResources(
        nodes=r.nodes,
        spare_nodes=r.spare_nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_task=r.cpus_per_task or max(1, profile.cpus_per_node // tasks),
        mem=str(mem) if mem is not None else None,
        time=str(r.time) if r.time is not None else None,
        partition=r.partition or profile.partition,
        account=r.account or profile.account,
        qos=r.qos or profile.qos,
        constraint=r.constraint,
        reservation=r.reservation,
        exclusive=r.exclusive,
        time_min=str(r.time_min) if r.time_min is not None else None,
        wait_all_nodes=r.wait_all_nodes,
        extra_sbatch=r.extra_sbatch,
    )


def resolved_parallelism(
    p: Parallelism, dp: int, micro: int, accumulation: int, global_batch: int
) -> ResolvedParallelism:
    return ResolvedParallelism(
        dp=dp,
        tp=p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=p.ep,
        zero_stage=p.zero_stage,
        offload_optimizer=p.offload_optimizer,
        offload_params=p.offload_params,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        gradient_accumulation_steps=accumulation,
        fsdp=p.fsdp,
    )


def resolve(
    recipe: Recipe, profile: ClusterProfile, resources: ResolvedResources, parallelism: ResolvedParallelism
) -> ResolvedRecipe:
    """The recipe with the profile's defaults and the derived layout filled in (the recipe always wins)."""
    preflight = recipe.preflight if isinstance(recipe.preflight, Preflight) else Preflight(enabled=recipe.preflight)
    network = recipe.network
    return ResolvedRecipe(
        name=recipe.name,
        cluster=recipe.cluster,
        description=recipe.description,
        resources=resources,
        parallelism=parallelism,
        launcher=recipe.launcher,
        process_model=process_model_of(recipe),
        launcher_args=recipe.launcher_args,
        rendezvous=recipe.rendezvous,
        precision=recipe.precision or ("bf16" if profile.accelerator == "gpu" else "fp32"),
        task=recipe.task,
        steps=resolve_steps(recipe),
        network=ResolvedNetwork(profile=network.profile or profile.interconnect, env=network.env, debug=network.debug),
        deepspeed=recipe.deepspeed,
        accelerate=recipe.accelerate,
        preemption=recipe.preemption,
        preflight=preflight,
        env=recipe.env,
        secrets=notify_secrets(recipe.secrets, recipe.notify),
        setup=recipe.setup,
        srun=recipe.srun,
        service=recipe.service,
        components=recipe.components,
        watchdog=recipe.watchdog,
        notify=recipe.notify,
        collective_timeout=recipe.collective_timeout,
        profile=recipe.profile,
        container=(
            msgspec.structs.replace(profile.container, image=recipe.container_image or profile.container.image)
            if profile.container
            else None
        ),
        hooks=recipe.hooks,
        drop=recipe.drop,
        runs_dir=recipe.runs_dir or profile.runs_dir or DEFAULT_RUNS_DIR,
        master_port=recipe.master_port,
        python=python_argv(recipe.python or profile.python),
        resume_from=recipe.resume_from,
        sweep=recipe.sweep,
        array=ArrayPlacement(spec=recipe.resources.array) if recipe.resources.array else None,
        tracking=as_tracking(recipe.tracking),
    )


def resolve_steps(recipe: Recipe) -> list[ResolvedStep] | None:
    """Each step as it runs; the training step's task is the recipe's own (its local paths made
    absolute by the loader)."""
    if recipe.steps is None:
        return None
    training = training_step(recipe)
    resolved = []
    for index, step in enumerate(recipe.steps):
        runs = step_recipe(recipe, step)
        resolved.append(
            ResolvedStep(
                name=step.name,
                task=recipe.task if index == training else step.task,
                launcher=runs.launcher,
                process_model=process_model_of(runs),
                launcher_args=runs.launcher_args,
                srun=runs.srun,
                env=step.env,
                nodes=runs.resources.nodes,
                repeat=step.repeat,
            )
        )
    return resolved


def decode_job_file(text: bytes | str) -> JobFile:
    """``job.json`` as the typed structs it was written from."""
    return msgspec.json.decode(text, type=JobFile)

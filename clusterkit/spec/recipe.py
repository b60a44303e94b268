"""The recipe: what to train and how to lay it out. Plain typed structs (msgspec) — the one source
of truth that every rendered file is a pure function of.

Field names are public interface: ``--set resources.nodes=4`` and the docs use them.
This is the recipe as written: a field left ``None`` (or ``auto``) is filled from the cluster profile
or derived when the loader builds a :class:`clusterkit.spec.resolved.ResolvedRecipe`, which has every value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, field

from clusterkit.spec.components import COMPONENT_PATTERN_HINTS, Component, Service
from clusterkit.spec.hooks import Hooks
from clusterkit.spec.launchers import LAUNCHERS
from clusterkit.spec.notify import NOTIFY_PATTERN_HINTS, Notify
from clusterkit.spec.preemption import Preemption
from clusterkit.spec.profiling import STEPS_HINT, STEPS_PATTERN, Profiling
from clusterkit.spec.snapshot import Snapshot
from clusterkit.spec.text import END, LINE_BREAKING, LINE_PATTERN, NON_EMPTY_LINE_PATTERN
from clusterkit.spec.tracking import TRACKING_PATTERN_HINTS, Tracker, Tracking
from clusterkit.spec.watchdog import DURATION_HINT, DURATION_PATTERN, Duration, Watchdog

NAME_PATTERN = f"^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}{END}"
IDENTIFIER_PATTERN = f"^[A-Za-z_][A-Za-z0-9_]*{END}"  # environment variable and class names
MEMORY_PATTERN = rf"^\d+[KMGT]?{END}"
SBATCH_FLAG_PATTERN = f"^[a-z][a-z0-9-]*{END}"
WORD_PATTERN = rf"^[^\s{LINE_BREAKING}]+{END}"
NO_NUL_PATTERN = rf"^[^\x00]*{END}"
# sbatch's --array: indices and ranges (with :step), comma-separated, then an optional %throttle.
ARRAY_PATTERN = rf"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?{END}"
KEY_PATH_PATTERN = rf"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*{END}"
# What a value failing each pattern must be; the loader words its error with these.
PATTERN_HINTS = {
    LINE_PATTERN: "a single line of text without control characters or line breaks",
    NON_EMPTY_LINE_PATTERN: "a non-empty single line of text without control characters or line breaks",
    NAME_PATTERN: "letters, digits, '.', '_' and '-' only, starting with a letter or digit, at most 64",
    IDENTIFIER_PATTERN: "letters, digits and '_' only, not starting with a digit",
    MEMORY_PATTERN: "a SLURM memory size: a whole number of megabytes, or one with a K, M, G or T suffix "
    "(e.g. 4000M, 4G, 480G); 0 for all of a node's memory",
    SBATCH_FLAG_PATTERN: "a long sbatch option name without dashes, e.g. mail-type",
    WORD_PATTERN: "one word without spaces (give a list for a command with arguments, e.g. [python3, -u])",
    NO_NUL_PATTERN: "text without NUL characters",
    ARRAY_PATTERN: "a SLURM array spec such as 0-9, 1,3,5-7 or 0-15:2%4",
    KEY_PATH_PATTERN: "a recipe key path as --set takes it, e.g. task.trainer.args.learning_rate",
    **TRACKING_PATTERN_HINTS,
    **NOTIFY_PATTERN_HINTS,
    **COMPONENT_PATTERN_HINTS,
    DURATION_PATTERN: DURATION_HINT,
    STEPS_PATTERN: STEPS_HINT,
}

Line = Annotated[str, Meta(pattern=LINE_PATTERN)]
NonEmptyLine = Annotated[str, Meta(min_length=1, pattern=NON_EMPTY_LINE_PATTERN)]
Name = Annotated[
    str,
    Meta(
        pattern=NAME_PATTERN,
        description="Job and run-directory name: letters, digits, '.', '_' and '-', at most 64.",
    ),
]
EnvName = Annotated[str, Meta(pattern=IDENTIFIER_PATTERN)]
# Environment values reach the shell quoted, line breaks included; only NUL cannot be carried at all.
EnvText = Annotated[str, Meta(pattern=NO_NUL_PATTERN)]


class EnvEdit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Extend a path-like variable instead of replacing it: ``{prepend: /opt/x/lib}`` gives
    ``/opt/x/lib:$VAR`` (``/opt/x/lib`` alone when VAR is unset or empty); ``append`` likewise at the end."""

    prepend: EnvText | None = None
    append: EnvText | None = None


# A value sets the variable; an edit extends it; null unsets it (also one a cluster profile set).
EnvValue = Union[EnvText, int, float, bool, EnvEdit, None]
EnvMap = dict[EnvName, EnvValue]
PositiveInt = Annotated[int, Meta(ge=1, le=1_000_000)]
# SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.
SLURM_TIME_PATTERN = rf"^(\d+-\d{{1,2}}(:\d{{1,2}}){{0,2}}|\d+(:\d{{1,2}}){{0,2}}){END}"
PATTERN_HINTS[SLURM_TIME_PATTERN] = (
    "a SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 1:30:00, 2-00:00:00)"
)
SlurmTime = Union[
    Annotated[str, Meta(pattern=SLURM_TIME_PATTERN)],
    Annotated[int, Meta(ge=1)],
]
# An interpreter: one word, or an argv list such as [python3, -u] (each item one word of the command).
PythonCommand = Union[Annotated[str, Meta(pattern=WORD_PATTERN)], list[NonEmptyLine]]
MemoryText = Annotated[str, Meta(pattern=MEMORY_PATTERN, description="SLURM memory, e.g. 480G; 0 = all")]
# A bare number is megabytes, as sbatch --mem reads it (`mem: 0`, all of a node's, as YAML writes it).
Memory = Union[MemoryText, Annotated[int, Meta(ge=0)]]
Offload = Literal["none", "cpu", "nvme"]
# none: clusterkit sets no network variable at all (the site's modules or container set them).
NetworkProfileName = Literal["infiniband", "roce", "efa", "slingshot", "ethernet", "loopback", "none"]
Precision = Literal["bf16", "fp16", "fp32"]
# command: your own command on every node (it starts the ranks); srun: task.program per rank (docs/guides/launchers.md).
# mpirun: Open MPI's, once in the batch shell; it starts a daemon per node through srun, and the ranks.
Launcher = Literal[tuple(LAUNCHERS)]  # one record each in spec.launchers
Rendezvous = Literal["static", "c10d"]
# How ranks start: one launcher per node that starts the node's ranks (torchrun, DeepSpeed), or one
# srun task per GPU, srun being the launcher (python, srun; RANK etc. mapped from SLURM's variables).
# batch_launcher: one launcher runs in the batch shell and starts every rank through an srun step of
# its own (DeepSpeed's --launcher slurm; Open MPI's mpirun, whose daemons srun starts; your front end: command).
ProcessModel = Literal["launcher_per_node", "task_per_gpu", "batch_launcher"]
SbatchValue = Union[Line, int, bool]
SbatchFlag = Annotated[str, Meta(pattern=SBATCH_FLAG_PATTERN)]


class _Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    """Base: unknown keys are errors, every field is a keyword."""


class Resources(_Struct):
    nodes: PositiveInt = 1
    # Hot spares: SLURM is asked for nodes + spare_nodes and training runs on `nodes`; when a node
    # fails, the launch starts again in the same job on a spare, from the newest complete checkpoint
    # (preemption.max_restarts bounds how often). Without a spare left, a failure is retried as a
    # new job (preemption.max_retries).
    spare_nodes: Annotated[int, Meta(ge=0, le=1024)] = 0
    gpus_per_node: Annotated[int, Meta(ge=1, le=64)] | None = None
    cpus_per_task: PositiveInt | None = None
    mem: Memory | None = None
    time: SlurmTime | None = None
    partition: NonEmptyLine | None = None
    account: NonEmptyLine | None = None
    qos: NonEmptyLine | None = None
    constraint: NonEmptyLine | None = None
    reservation: NonEmptyLine | None = None
    exclusive: bool = False
    # --time-min: the job may start with less than `time` (down to this) where that fits a backfill
    # window sooner; the run resumes from its checkpoints like any requeued job.
    time_min: SlurmTime | None = None
    # --wait-all-nodes=1: the batch script starts only once every node has booted (cloud/power-saving sites).
    wait_all_nodes: bool = False
    # A SLURM job array (script tasks): one task per index, each in its own run directory
    # <runs_dir>/<name>/<array id>/<index>/, $SLURM_ARRAY_TASK_ID set; e.g. 0-9%2 (2 at a time).
    array: Annotated[str, Meta(pattern=ARRAY_PATTERN)] | None = None
    extra_sbatch: dict[SbatchFlag, SbatchValue] = field(default_factory=dict)


class Srun(_Struct):
    """Options of the ``srun`` step that starts the launchers (one task per node)."""

    kill_on_bad_exit: bool = True  # end every node's launcher when one fails
    # --wait=S: end the step S seconds after the first task exits (0, SLURM's default: wait for all).
    wait: Annotated[int, Meta(ge=0, le=86400)] | None = None
    mpi: Annotated[str, Meta(pattern=WORD_PATTERN)] | None = None  # e.g. pmix, pmi2, none
    distribution: Annotated[str, Meta(pattern=WORD_PATTERN)] | None = None  # e.g. block:cyclic
    cpu_bind: Annotated[str, Meta(pattern=WORD_PATTERN)] | None = None  # e.g. none, cores, verbose,none
    label: bool = False  # prefix each output line with its task number
    # Any other srun option, e.g. a site plugin's (container-image, auto-resume): flag -> value, or
    # true for a bare flag. Options the step owns are refused with the field that sets them.
    extra: dict[SbatchFlag, SbatchValue] = field(default_factory=dict)


class ProfileDrops(_Struct):
    """What of the cluster profile's this recipe does without: modules it would load and setup lines
    it would run, named as the profile writes them (a name it does not have is an error)."""

    modules: list[NonEmptyLine] = field(default_factory=list)
    setup: list[Line] = field(default_factory=list)


class Fsdp(_Struct):
    """FSDP2: parameters, gradients and optimizer states sharded over ``shard_size`` data-parallel ranks
    (fewer than all: HSDP, dp / shard_size replicas). The built-in runner's (GPU only), or a script's:
    read as CLUSTERKIT_FSDP_*, or as accelerate's FSDP config under launcher: accelerate (GPU only)."""

    shard_size: PositiveInt | None = None  # default: every rank (full shard)
    # The transformer block class to wrap (e.g. LlamaDecoderLayer); default: the model's own
    # _no_split_modules, as transformers picks them.
    auto_wrap: Annotated[str, Meta(pattern=IDENTIFIER_PATTERN)] | None = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    state_dict: Literal["sharded", "full"] = "sharded"


class Parallelism(_Struct):
    dp: Annotated[int, Meta(ge=1)] | Literal["auto"] = "auto"
    tp: Annotated[int, Meta(ge=1, le=64)] = 1
    pp: Annotated[int, Meta(ge=1, le=1024)] = 1
    # Context parallelism (the sequence split over cp ranks) and expert parallelism (a MoE's experts
    # spread over ep of the data-parallel ranks), for script tasks whose framework does them:
    # dp*tp*pp*cp == nodes*gpus_per_node, and ep divides dp.
    cp: Annotated[int, Meta(ge=1, le=1024)] = 1
    ep: Annotated[int, Meta(ge=1, le=1024)] = 1
    zero_stage: Annotated[int, Meta(ge=0, le=3)] = 0
    offload_optimizer: Offload = "none"
    offload_params: Offload = "none"
    micro_batch_size: PositiveInt | None = None
    global_batch_size: Annotated[int, Meta(ge=1, le=100000000)] | None = None
    gradient_accumulation_steps: PositiveInt | None = None
    fsdp: Fsdp | None = None  # FSDP2 instead of DDP/ZeRO (the built-in runner's, or a script's)


class ModelSpec(_Struct):
    """Exactly one of ``config`` (a dict, or a path to a local config.json) and ``pretrained``."""

    config: dict[str, Any] | NonEmptyLine | None = None
    pretrained: NonEmptyLine | None = None
    tokenizer: NonEmptyLine | None = None
    # The attention kernel; default: flash_attention_2 on a GPU where flash-attn is installed, else sdpa.
    attention: Literal["sdpa", "flash_attention_2", "eager"] | None = None


class DatasetSpec(_Struct):
    type: Literal["synthetic", "text", "jsonl", "disk"] = "synthetic"
    path: NonEmptyLine | None = None
    field: NonEmptyLine = "text"
    seq_len: Annotated[int, Meta(ge=2, le=1_048_576)] = 128
    num_samples: Annotated[int, Meta(ge=1, le=100_000_000)] = 1024


class TrainerTask(_Struct):
    model: ModelSpec
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    # Passed to transformers.TrainingArguments; keys the recipe owns elsewhere are rejected.
    args: dict[str, Any] = field(default_factory=dict)


class Task(_Struct):
    """Exactly one of ``trainer`` (the built-in HF Trainer runner), ``script`` and ``program``."""

    trainer: TrainerTask | None = None
    script: NonEmptyLine | None = None
    program: NonEmptyLine | None = None  # exec'd as it is per rank (launcher srun) or node (command); ./x or x on PATH
    module: bool = False
    args: list[Annotated[str, Meta(pattern=NO_NUL_PATTERN)]] = field(default_factory=list)
    # For a script task: its parameter count, and/or its model's config (layers, heads, ...) so the
    # layout checks and `clusterkit plan` can use them.
    model_size: Annotated[int, Meta(ge=1)] | None = None
    model_config: dict[str, Any] | None = None


class DeepSpeedSettings(_Struct):
    # Whether the job uses DeepSpeed (ds_config.json rendered, the runner hands it to the Trainer).
    # Default: with the deepspeed launcher or ZeRO >= 1; true also for a script that drives DeepSpeed
    # itself at ZeRO-0 (e.g. bf16 under torchrun); false is refused where DeepSpeed is needed.
    enabled: bool | None = None
    # A whole or partial DeepSpeed config (a dict, or a JSON file path relative to the recipe),
    # deep-merged over the one clusterkit renders; the keys it changes are reported.
    config: dict[str, Any] | NonEmptyLine | None = None
    # DeepSpeed's -i/-e syntax, e.g. "node1:0,1@node2"; the batch sizes then follow the ranks that remain.
    include: NonEmptyLine | None = None
    exclude: NonEmptyLine | None = None


class AccelerateSettings(_Struct):
    # launcher: accelerate reads a config file clusterkit renders from the recipe (accelerate_config.yaml
    # in the run directory), or this one of yours (relative to the recipe; its type, ZeRO and FSDP settings
    # checked against parallelism); the layout flags (machines, processes, rank, main process) win over it.
    config: NonEmptyLine | None = None


class Preflight(_Struct):
    """A collective benchmark every rank joins before training, in the same allocation
    (``preflight: true`` is short for ``{enabled: true}``)."""

    enabled: bool = True
    # A node whose intra-node all-reduce bus bandwidth is below this share of the median node's is slow.
    slow_fraction: Annotated[float, Meta(gt=0, lt=1)] = 0.8
    # warn: named in status and the log; fail: the job stops; exclude: it stops, and its automatic
    # retry (preemption.max_retries) runs without the slow nodes.
    on_slow: Literal["warn", "fail", "exclude"] = "warn"
    # Run the benchmark and stop (what `clusterkit preflight RECIPE` submits).
    only: bool = False


class Network(_Struct):
    profile: NetworkProfileName | None = None
    env: EnvMap = field(default_factory=dict)
    debug: bool = False


# A step's env values: text, numbers or booleans (1/0), set for its tasks on top of the recipe's env.
StepEnvValue = Union[EnvText, int, float, bool]


class JobStep(_Struct):
    """One of several steps run in order in the same allocation (``steps:``), each an srun step of
    its own (e.g. data preparation, training, evaluation). The first step that fails ends the job
    with its exit code; the steps after it do not run."""

    name: Name  # in status and the logs: steps/<name>/ in the run directory
    task: Task
    # Default: the recipe's. It may start fewer tasks per node than that one (with the node's CPUs), not more.
    launcher: Launcher | None = None
    # Default: the recipe's launcher_args where the step runs the recipe's launcher, else none.
    launcher_args: list[Annotated[str, Meta(pattern=NO_NUL_PATTERN)]] | None = None
    srun: Srun | None = None  # this step's srun options instead of the recipe's srun:
    env: dict[EnvName, StepEnvValue] = field(default_factory=dict)  # set for this step's tasks, beside env:
    # On the first `nodes` training nodes (default: all of resources.nodes). The layout (dp, tp, ...,
    # the built-in trainer) is the steps' on all nodes; a step on fewer runs a script.
    nodes: PositiveInt | None = None
    # Trials: the step run this many times in a row, {trial} (0, 1, ...) in task.args, launcher_args and
    # env values telling each its number (e.g. --seed={trial}); each trial's logs in steps/<name>/<trial>/.
    repeat: Annotated[int, Meta(ge=1, le=10_000)] = 1


SweepValue = Union[Annotated[str, Meta(pattern=NO_NUL_PATTERN)], int, float, bool]


class Sweep(_Struct):
    """A hyper-parameter grid: every combination of the values is one point, run as one task of one
    SLURM job array (``clusterkit sweep``, or ``submit`` of a recipe with this block)."""

    # recipe key path (as --set writes it) -> the values it takes, e.g. task.trainer.args.learning_rate: [1e-3, 3e-4]
    grid: dict[Annotated[str, Meta(pattern=KEY_PATH_PATTERN)], Annotated[list[SweepValue], Meta(min_length=1)]]
    max_parallel: PositiveInt | None = None  # the array's %throttle: at most this many points at once


class Recipe(_Struct, kw_only=True):
    name: Name
    cluster: NonEmptyLine = "dev"
    description: str | None = None
    resources: Resources = field(default_factory=Resources)
    parallelism: Parallelism = field(default_factory=Parallelism)
    launcher: Launcher = "torchrun"
    # Default: the launcher's own (spec.launchers); a value that does not match it is an error.
    process_model: ProcessModel | None = None
    # More words for the launcher (torchrun / DeepSpeed), e.g. [--max-restarts=3, --role, trainer];
    # flags clusterkit writes are refused with the field that sets them.
    launcher_args: list[Annotated[str, Meta(pattern=NO_NUL_PATTERN)]] = field(default_factory=list)
    # torchrun's rendezvous: static (node ranks from SLURM) or c10d (the agents agree on ranks at
    # $MASTER_ADDR:$MASTER_PORT; needs an endpoint the first node's agent can own).
    rendezvous: Rendezvous = "static"
    precision: Precision | None = None
    task: Task = field(default_factory=Task)  # or, for several steps in one allocation, steps: (JobStep)
    steps: Annotated[list[JobStep], Meta(min_length=1, max_length=64)] | None = None
    network: Network = field(default_factory=Network)
    deepspeed: DeepSpeedSettings = field(default_factory=DeepSpeedSettings)
    accelerate: AccelerateSettings = field(default_factory=AccelerateSettings)
    preemption: Preemption = field(default_factory=Preemption)
    # Resolved always to a Preflight (false → enabled: false).
    preflight: bool | Preflight = False
    env: EnvMap = field(default_factory=dict)
    secrets: list[EnvName] = field(default_factory=list)  # names only: values come from the submitting environment
    setup: list[Line] = field(default_factory=list)
    srun: Srun = field(default_factory=Srun)
    service: Service | None = None
    components: Annotated[list[Component], Meta(min_length=1, max_length=16)] | None = None  # spec.components
    watchdog: Watchdog | None = None  # a hung job found and ended (spec.watchdog)
    # Where the job's events go (a webhook, SLURM's e-mail) and which (spec.notify); default: the
    # user config's notify:, and null turns that off.
    notify: Notify | None = None
    # How long a rank waits in one collective before it fails (and, on a GPU, dumps its NCCL flight
    # recorder): the built-in runner's ddp_timeout, $CLUSTERKIT_COLLECTIVE_TIMEOUT_S for a script.
    # Default: the Trainer's (30 minutes), or what a script sets.
    collective_timeout: Duration | None = None
    profile: Profiling | None = None  # a few steps of the built-in runner profiled (spec.profiling)
    # The container image for this recipe, instead of the cluster profile's (which says the runtime).
    container_image: NonEmptyLine | None = None
    hooks: Hooks = field(default_factory=Hooks)
    # The profile's modules and setup lines to leave out (to drop a profile's env variable, set it to null in env).
    drop: ProfileDrops = field(default_factory=ProfileDrops)
    runs_dir: NonEmptyLine | None = None
    # The rendezvous port on the first training node; default: 10000 + job id mod 20000, moved on
    # while something already answers there.
    master_port: Annotated[int, Meta(ge=1024, le=65535)] | None = None
    # The launchers' and ranks' interpreter, instead of the cluster profile's: one word or an argv list.
    python: PythonCommand | None = None
    sweep: Sweep | None = None
    # Checkpoints of an earlier run to continue from (`clusterkit submit --resume RUN_DIR` sets it).
    resume_from: NonEmptyLine | None = None
    tracking: Tracker | Tracking = "none"  # resolved always to a Tracking (wandb → tracker: wandb)
    snapshot: bool | Snapshot | None = None  # the code copied at submit (spec.snapshot); default: a script's


def process_model_of(recipe: Recipe) -> ProcessModel:
    """The recipe's process model as written, or its launcher's own."""
    return recipe.process_model or LAUNCHERS[recipe.launcher].process_model  # type: ignore[return-value]


def tasks_per_node(process_model: str, gpus_per_node: int) -> int:
    """srun tasks per node: the node's launcher, or one task per rank (started by srun or a batch launcher)."""
    return 1 if process_model == "launcher_per_node" else gpus_per_node

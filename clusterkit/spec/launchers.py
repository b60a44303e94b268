"""One record per launcher: the process models it runs under, the Python package it runs from, the
flags it owns, and how its command is built. Everything clusterkit knows of a launcher is here; the
launch plan (:mod:`clusterkit.spec.launch_plan`), the image check and the recipe checks read it.

Commands are :class:`Words`: each word is literal unless marked as holding run-time values
(``{node_rank}``, ``{master_port}``, ...: :mod:`clusterkit.supervisor.plan`), which the job fills in
where they are known. Nothing is ever shell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clusterkit.spec.runtime_values import placeholders

if TYPE_CHECKING:
    from clusterkit.spec.resolved import ResolvedRecipe

LAUNCHER_PER_NODE, TASK_PER_GPU, BATCH_LAUNCHER = "launcher_per_node", "task_per_gpu", "batch_launcher"
RANKS_DIR = "ranks"  # clusterkit.spec.layout (spec imports nothing above it)


@dataclass
class Words:
    """A command being built: its words, and which of them hold run-time values."""

    words: list[str] = field(default_factory=list)
    expand: list[int] = field(default_factory=list)

    def add(self, *words: str) -> Words:
        self.words += words
        return self

    def runtime(self, *words: str) -> Words:
        """Words with run-time values to fill in."""
        self.expand += range(len(self.words), len(self.words) + len(words))
        self.words += words
        return self

    def given(self, *words: str) -> Words:
        """Words as the recipe gives them (task.args, launcher_args): those holding a run-time value
        marked for the job to fill in, the rest literal."""
        for word in words:
            (self.runtime if placeholders(word) else self.add)(word)
        return self

    def extend(self, other: Words) -> Words:
        self.expand += [len(self.words) + index for index in other.expand]
        self.words += other.words
        return self


@dataclass(frozen=True)
class Program:
    """What the ranks run: a script or module and its arguments (``args`` already a Words: a user's
    argument may hold run-time values)."""

    entry: Words
    module: bool
    args: Words
    # Words each rank's command runs under (profile: kind nsys); only launchers that can start a rank
    # through another program take one: those with wraps_ranks.
    wrapper: Words = field(default_factory=Words)

    def words(self, module_flag: str) -> Words:
        return Words().add(*([module_flag] if self.module else [])).extend(self.entry).extend(self.args)


@dataclass(frozen=True)
class Launcher:
    name: str
    process_models: tuple[str, ...]  # the first is the launcher's own
    package: str | None  # the Python package it runs from (None: none of its own)
    # Flags clusterkit sets for this launcher -> the recipe field that sets them (also flags that
    # would fight what clusterkit sets): refused in launcher_args with that field.
    owned: Mapping[str, str]
    # The command of one node (or, with a task per rank, one rank): launcher_per_node, task_per_gpu.
    command: Callable[[ResolvedRecipe, Program], Words] | None
    # The command run once in the batch shell, which starts every rank itself: batch_launcher.
    batch_command: Callable[[ResolvedRecipe, Program], Words] | None = None
    # Flags it writes as a default that launcher_args may set again (the later one wins).
    defaults: frozenset[str] = frozenset()
    ranks: str = "none"  # which rank variables the node agent sets (supervisor.plan.Step.ranks)
    signal_to_launcher: bool = False  # supervisor.plan.Step.signal_to_launcher
    wraps_ranks: bool = False  # its command puts Program.wrapper before each rank's interpreter
    # Each task's program replaces the node agent (exec) once its rank variables are set: nothing of
    # clusterkit's stays between srun's task and the program (supervisor.plan.Step.replace).
    replaces_agent: bool = False
    # Which of the task's forms it starts (recipe.Task): trainer, script, program (an executable,
    # started as it is: no interpreter before it).
    tasks: tuple[str, ...] = ("trainer", "script")
    # In the batch shell: each rank it starts runs clusterkit's rank program (python supervisor rank
    # ENTRY ...), which maps the rank's ids; False: a front end of the user's that starts its ranks
    # itself is given the task as written.
    batch_ranks: bool = True

    @property
    def process_model(self) -> str:
        return self.process_models[0]


_LAYOUT = "the launch step (from the allocation)"
_LOGS = "runs_dir (each rank's output is in the run directory)"
_NODE_LOGS = "{run_dir}/" + RANKS_DIR + "/node{node_rank}"


def _torchrun(recipe: ResolvedRecipe, program: Program) -> Words:
    words = (
        Words()
        .add(*recipe.python, "-m", "torch.distributed.run")
        .runtime("--node-rank={node_rank}", f"--log-dir={_NODE_LOGS}")
    )
    words.add(f"--nnodes={recipe.resources.nodes}", f"--nproc-per-node={recipe.resources.gpus_per_node}")
    if recipe.rendezvous == "c10d":
        words.add("--rdzv-backend=c10d").runtime("--rdzv-endpoint={master_addr}:{master_port}", "--rdzv-id={job_id}")
    else:
        words.runtime("--master-addr={master_addr}", "--master-port={master_port}")
    words.add("--tee=3").given(*recipe.launcher_args)
    if program.wrapper.words:  # torchrun starts each rank as the wrapper's command, which runs python
        return words.add("--no-python").extend(program.wrapper).add(*recipe.python).extend(program.words("-m"))
    return words.extend(program.words("-m"))


def _deepspeed(recipe: ResolvedRecipe, program: Program) -> Words:
    words = (
        Words()
        .add(*recipe.python, "-m", "deepspeed.launcher.runner")
        .runtime("--node_rank={node_rank}", f"--enable_each_rank_log={_NODE_LOGS}", "--hostfile={run_dir}/hostfile")
    )
    words.add("--no_ssh").runtime("--master_addr={master_addr}", "--master_port={master_port}")
    if recipe.deepspeed.include:
        words.add(f"--include={recipe.deepspeed.include}")
    if recipe.deepspeed.exclude:
        words.add(f"--exclude={recipe.deepspeed.exclude}")
    return words.given(*recipe.launcher_args).extend(program.words("--module"))


# accelerate's distributed_type -> what clusterkit adds for it on the command line. DEEPSPEED and FSDP
# are read from the config file (checked against the recipe at validate): a --use_deepspeed or
# --use_fsdp flag would make accelerate skip the file's parallelism_config (HSDP, tp, cp). DeepSpeed's
# per-node launcher is torchrun (standard), never pdsh over ssh.
ACCELERATE_TYPE_FLAGS = {
    "MULTI_GPU": ("--multi_gpu",),
    "DEEPSPEED": ("--deepspeed_multinode_launcher=standard",),
    "FSDP": (),
}


def accelerate_type(recipe: ResolvedRecipe) -> str:
    """What accelerate runs for the recipe's layout: a script's ZeRO as DEEPSPEED, its
    parallelism.fsdp as FSDP, else MULTI_GPU (torch.distributed data parallelism). The built-in
    runner starts DeepSpeed and FSDP itself, from its TrainingArguments, so it stays MULTI_GPU."""
    if recipe.task.trainer is not None:
        return "MULTI_GPU"
    if recipe.uses_deepspeed:
        return "DEEPSPEED"
    return "FSDP" if recipe.parallelism.fsdp is not None else "MULTI_GPU"


def _accelerate(recipe: ResolvedRecipe, program: Program) -> Words:
    words = (
        Words()
        .add(*recipe.python, "-m", "accelerate.commands.launch")
        .runtime("--machine_rank={node_rank}", f"--log_dir={_NODE_LOGS}")
    )
    if recipe.accelerate.config:
        words.add(f"--config_file={recipe.accelerate.config}")
    else:
        words.runtime("--config_file={run_dir}/accelerate_config.yaml")
    words.add(
        *ACCELERATE_TYPE_FLAGS[accelerate_type(recipe)],
        f"--num_machines={recipe.resources.nodes}",
        f"--num_processes={recipe.world_size}",
        "--same_network",
        "--rdzv_backend=static",
    )
    words.runtime("--main_process_ip={master_addr}", "--main_process_port={master_port}")
    return words.add("--tee=3").given(*recipe.launcher_args).extend(program.words("--module"))


def _python(recipe: ResolvedRecipe, program: Program) -> Words:
    return Words().extend(program.wrapper).add(*recipe.python).extend(program.words("-m"))


def _command(recipe: ResolvedRecipe, program: Program) -> Words:
    return Words().extend(program.entry).extend(program.args)


def _deepspeed_batch(recipe: ResolvedRecipe, program: Program) -> Words:
    """DeepSpeed's launcher in the batch shell (``--launcher slurm``): its own srun starts a task per
    rank, each running ``python -u <rank program> ...``; the srun options are added by the plan."""
    words = Words().add(*recipe.python, "-m", "deepspeed.launcher.runner", "--launcher=slurm", "--no_ssh_check")
    words.runtime("--hostfile={run_dir}/hostfile", "--master_addr={master_addr}", "--master_port={master_port}")
    return words.given(*recipe.launcher_args).extend(program.words("--module"))


def _mpirun(recipe: ResolvedRecipe, program: Program) -> Words:
    """Open MPI's mpirun in the batch shell: a daemon per node through its own srun, the node's ranks
    under it, ranked contiguously per node (ppr), unbound (a --bind-to in launcher_args comes later
    and wins); each rank's output below ranks/mpirun-<job id>."""
    words = (
        Words()
        .add(
            "mpirun",
            "--np",
            str(recipe.world_size),
            "--map-by",
            f"ppr:{recipe.ranks_per_node}:node",
            "--bind-to",
            "none",
            "--output-filename",
        )
        .runtime("{run_dir}/" + RANKS_DIR + "/mpirun-{job_id}")
    )
    return words.given(*recipe.launcher_args).add(*recipe.python, "-u").extend(program.words("--module"))


def _ray_driver(recipe: ResolvedRecipe, program: Program) -> Words:
    """Ray's driver, once in the batch shell (on the head's node) once every node joined the cluster
    (RAY_ADDRESS in its environment): the recipe's script or module; the Ray nodes are the plan's
    ray steps (:mod:`clusterkit.spec.ray_cluster`)."""
    return Words().add(*recipe.python).extend(program.words("-m"))


_TORCHRUN_OWNED = {
    "nnodes": "resources.nodes",
    "nproc-per-node": "resources.gpus_per_node",
    "node-rank": _LAYOUT,
    "master-addr": _LAYOUT,
    "master-port": "master_port",
    "rdzv-backend": "rendezvous",
    "rdzv-endpoint": "rendezvous",
    "rdzv-id": "rendezvous",
    "standalone": "resources.nodes",
    "log-dir": _LOGS,
    "module": "task.module",
    "no-python": "launcher: command",
    "m": "task.module",
    "tee": "nothing: each rank's output is kept",
}
_ACCELERATE_OWNED = {
    "num-machines": "resources.nodes",
    "num-processes": "resources.nodes and resources.gpus_per_node",
    "machine-rank": _LAYOUT,
    "main-process-ip": _LAYOUT,
    "main-process-port": "master_port",
    "config-file": "accelerate.config",
    "same-network": _LAYOUT,
    "rdzv-backend": _LAYOUT,
    "log-dir": _LOGS,
    "module": "task.module",
    "mixed-precision": "precision",
    "use-deepspeed": "parallelism.zero_stage",
    "deepspeed-multinode-launcher": _LAYOUT,
    "zero-stage": "parallelism.zero_stage",
    "offload-optimizer-device": "parallelism.offload_optimizer",
    "offload-param-device": "parallelism.offload_params",
    "use-fsdp": "parallelism.fsdp",
    "fsdp-version": "parallelism.fsdp",
    "fsdp-reshard-after-forward": "parallelism.fsdp.reshard_after_forward",
    "fsdp-sharding-strategy": "parallelism.fsdp",
    "fsdp-offload-params": "parallelism.fsdp.cpu_offload",
    "fsdp-activation-checkpointing": "parallelism.fsdp.activation_checkpointing",
    "fsdp-state-dict-type": "parallelism.fsdp.state_dict",
    "fsdp-transformer-layer-cls-to-wrap": "parallelism.fsdp.auto_wrap",
    "parallelism-config-dp-shard-size": "parallelism.fsdp.shard_size",
    "parallelism-config-dp-replicate-size": "parallelism.fsdp.shard_size",
    "parallelism-config-tp-size": "parallelism.tp",
    "parallelism-config-cp-size": "parallelism.cp",
    "use-parallelism-config": "parallelism.fsdp",
    "deepspeed-config-file": "accelerate.config (its deepspeed_config.deepspeed_config_file)",
    "multi-gpu": _LAYOUT,
    "cpu": "the cluster profile (accelerator)",
    "no-python": "launcher: command",
    "tee": "nothing: each rank's output is kept",
}
_DEEPSPEED_OWNED = {
    "hostfile": _LAYOUT,
    "no-ssh": _LAYOUT,
    "node-rank": _LAYOUT,
    "master-addr": _LAYOUT,
    "master-port": "master_port",
    "num-nodes": "resources.nodes",
    "num-gpus": "resources.gpus_per_node",
    "enable-each-rank-log": _LOGS,
    "include": "deepspeed.include",
    "exclude": "deepspeed.exclude",
    "module": "task.module",
    "launcher": "launcher (DeepSpeed runs here as one launcher per node)",
    "no-python": "launcher: command",
    "no-ssh-check": _LAYOUT,
    "launcher-args": "srun: (the options of the step DeepSpeed starts)",
}
_MPIRUN_OWNED = {
    "np": "resources.nodes and resources.gpus_per_node",
    "n": "resources.nodes and resources.gpus_per_node",
    "c": "resources.nodes and resources.gpus_per_node",
    "map-by": _LAYOUT,
    "npernode": _LAYOUT,
    "N": _LAYOUT,
    "npersocket": _LAYOUT,
    "hostfile": _LAYOUT,
    "machinefile": _LAYOUT,
    "host": _LAYOUT,
    "H": _LAYOUT,
    "rankfile": _LAYOUT,
    "output-filename": _LOGS,
}

# ray start's flags that the plan's ray steps set from the allocation (clusterkit.spec.ray_cluster).
_RAY_OWNED = {
    "head": _LAYOUT,
    "address": _LAYOUT,
    "port": _LAYOUT,
    "node-ip-address": _LAYOUT,
    "num-cpus": "resources.cpus_per_task",
    "num-gpus": "resources.gpus_per_node",
    "temp-dir": _LOGS,
    "block": _LAYOUT,
    "disable-usage-stats": _LAYOUT,
}

LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        Launcher("torchrun", (LAUNCHER_PER_NODE,), "torch", _TORCHRUN_OWNED, _torchrun, wraps_ranks=True),
        Launcher(
            "deepspeed",
            (LAUNCHER_PER_NODE, BATCH_LAUNCHER),
            "deepspeed",
            _DEEPSPEED_OWNED,
            _deepspeed,
            batch_command=_deepspeed_batch,
        ),
        Launcher("accelerate", (LAUNCHER_PER_NODE,), "accelerate", _ACCELERATE_OWNED, _accelerate),
        # srun is the launcher: a task per rank, its ids mapped to RANK & co. by the node agent, and the
        # preemption signal left at its default so that the rank's framework can install its handler.
        Launcher("python", (TASK_PER_GPU,), None, {}, _python, ranks="task", signal_to_launcher=True, wraps_ranks=True),
        # Your command, once per node: it starts the node's ranks (NNODES, NODE_RANK, ... in its environment);
        # or, process_model: batch_launcher, once in the batch shell, a front end that starts every rank.
        Launcher(
            "command",
            (LAUNCHER_PER_NODE, BATCH_LAUNCHER),
            None,
            {},
            _command,
            batch_command=_command,
            ranks="node",
            tasks=("script", "program"),
            batch_ranks=False,
        ),
        # srun is the launcher of task.program: a task per rank, whose node agent sets RANK & co. and
        # then execs the program in its own place (a binary, a shell script, a JAX process).
        Launcher(
            "srun",
            (TASK_PER_GPU,),
            None,
            {},
            _command,
            ranks="task",
            signal_to_launcher=True,
            replaces_agent=True,
            tasks=("program",),
        ),
        Launcher(
            "mpirun",
            (BATCH_LAUNCHER,),
            None,
            _MPIRUN_OWNED,
            None,
            batch_command=_mpirun,
            defaults=frozenset({"bind-to"}),
        ),
        # A Ray cluster on the allocation (a ray start per node, launcher_args its options), then the
        # driver, the task's script or module, once in the batch shell (clusterkit.supervisor.ray_cluster).
        Launcher(
            "ray",
            (LAUNCHER_PER_NODE,),
            "ray",
            _RAY_OWNED,
            None,
            batch_command=_ray_driver,
            tasks=("script",),
            batch_ranks=False,
        ),
    )
}

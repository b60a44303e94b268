"""A Python function as a job (``clusterkit.submit_function``): the resolved recipe and cluster
profile as the parameters of submitit's ``AutoExecutor``. :func:`executor_parameters` is the one
mapping; :data:`REFUSED` says, for each recipe key submitit cannot carry, why, so that a recipe
either runs as written or stops with one line, never with a value silently left out.

One task per GPU (``tasks_per_node`` = ``gpus_per_node``), as ``launcher: python`` starts its ranks,
so each task of a distributed function has its rank in SLURM's variables (submitit's
``helpers.TorchDistributedEnvironment`` reads them).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterkit.spec.network import env_value
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import EnvEdit, EnvMap
from clusterkit.spec.resolved import ResolvedRecipe
from clusterkit.spec.timefmt import slurm_time_minutes

KeyPath = tuple[str, ...]
_UNFIT_FOLDER = re.compile(r"[%\s\x00-\x1f\x7f]")
SLURM, LOCAL = "slurm", "local"
EXECUTORS = (SLURM, LOCAL)
LAUNCHER = "python"  # the launcher whose ranks a function's tasks are: one srun task per GPU
RECORD_LAUNCHER = "function"  # the run record's launcher: logs and status read submitit's files
_THE_FUNCTION = "the function is the job's task"
_NO_LAUNCHER = "submitit starts the function in each srun task itself (launcher: python's ranks)"
LAUNCHER_REFUSAL = f"a function's tasks are launcher: {LAUNCHER}'s ranks; {_NO_LAUNCHER}"

# Recipe keys that submitit's executors cannot carry -> why. Written in the recipe (or --set), each
# stops the submission with one line; the rest of the recipe is carried by executor_parameters.
REFUSED: dict[KeyPath, str] = {
    ("task",): f"{_THE_FUNCTION}; leave task: out",
    ("steps",): f"{_THE_FUNCTION}: one step; leave steps: out",
    ("process_model",): _NO_LAUNCHER,
    ("launcher_args",): _NO_LAUNCHER,
    ("rendezvous",): "the function sets up its own process group (helpers.TorchDistributedEnvironment)",
    ("precision",): "the function's own code chooses its precision",
    ("parallelism",): "the built-in runner's; the function's own code sets up its parallelism",
    ("deepspeed",): "the built-in runner's; the function's own code sets up DeepSpeed",
    ("accelerate",): "accelerate launch is not run for a function",
    ("preemption",): "a function's checkpoint and requeue are submitit's: make it a submitit.helpers.Checkpointable",
    ("preflight",): "clusterkit's supervisor does not run in a function's job",
    ("secrets",): "the function's job is given no secrets file",
    ("service",): "no supervisor starts a service beside a function",
    ("components",): "a function is one homogeneous submitit job, not a heterogeneous one",
    ("watchdog",): "clusterkit's supervisor does not run in a function's job",
    ("notify",): "clusterkit's supervisor does not run in a function's job",
    ("collective_timeout",): "the function sets up its own process group and its timeout",
    ("profile",): "the built-in runner's; profile inside the function",
    ("container_image",): "submitit runs the function in the submitting machine's Python, not in a container",
    ("hooks",): "clusterkit's supervisor does not run in a function's job; use setup: lines",
    ("drop",): "nothing of the profile's is dropped for a function (it takes the profile's setup as it is)",
    ("master_port",): "the function's process group chooses its port (helpers.TorchDistributedEnvironment)",
    ("python",): "the job runs the submitting machine's Python (sys.executable), as submitit pickles for it",
    ("sweep",): "use clusterkit.map_function for many calls",
    ("resume_from",): "a function resumes through submitit.helpers.Checkpointable",
    ("tracking",): "the built-in runner's; track inside the function",
    ("snapshot",): "the function is pickled whole; its modules come from the job's Python path",
    ("network",): "the function sets its own communication environment (use env:)",
    ("resources", "spare_nodes"): "no supervisor restarts a function's job on spare nodes",
    ("resources", "array"): "use clusterkit.map_function for an array",
}


@dataclass(frozen=True)
class Refusal:
    key_path: KeyPath
    message: str


@dataclass(frozen=True)
class ExecutorParameters:
    """What ``AutoExecutor(folder, cluster=executor).update_parameters(**parameters)`` is given."""

    executor: str
    parameters: dict[str, Any]


def refusals(
    recipe: ResolvedRecipe,
    profile: ClusterProfile,
    executor: str,
    written: Callable[[KeyPath], bool],
    runs_base: str,
) -> list[Refusal]:
    """Every part of the recipe (and profile) that a function's job cannot carry; ``written``: whether
    the recipe (or an override) sets a key path; ``runs_base``: the absolute ``<runs_dir>/<name>``."""
    found = [Refusal(path, reason) for path, reason in REFUSED.items() if written(path)]
    if _UNFIT_FOLDER.search(runs_base):
        found.append(
            Refusal(
                ("runs_dir",),
                f"{runs_base!r}: submitit writes the run directory unquoted into #SBATCH lines and SLURM's "
                "file patterns (%j): give a runs_dir without %, spaces or control characters",
            )
        )
    if recipe.launcher != LAUNCHER:
        found.append(Refusal(("launcher",), LAUNCHER_REFUSAL))
    if profile.login is not None:
        found.append(
            Refusal(
                ("cluster",), f"profile {profile.name} submits over SSH: submit_function runs on the login node itself"
            )
        )
    if profile.container is not None:
        found.append(Refusal(("cluster",), f"profile {profile.name} runs jobs in a container; a function runs without"))
    if profile.task_gpu_bind is not None:
        found.append(
            Refusal(("cluster",), f"profile {profile.name}: task_gpu_bind is the supervisor's; a function has none")
        )
    for where, env in ((("cluster",), profile.network_env), (("cluster",), profile.env), (("env",), recipe.env)):
        edited = [name for name, value in env.items() if isinstance(value, EnvEdit)]
        if edited:
            found.append(Refusal(where, f"{edited[0]}: prepend/append is the supervisor's; give the whole value"))
    if executor == LOCAL and recipe.resources.nodes > 1:
        found.append(Refusal(("resources", "nodes"), "the local executor runs one node (submitit's LocalExecutor)"))
    return found


def _exports(env: EnvMap) -> list[str]:
    """``export NAME=value`` lines, each value quoted: a value is data, never shell."""
    return [
        f"unset {name}" if value is None else f"export {name}={shlex.quote(env_value(value))}"
        for name, value in env.items()
        if not isinstance(value, EnvEdit)
    ]


def setup_lines(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[str]:
    """The batch script's lines before srun: modules (quoted), the profile's and the recipe's setup
    (the one place shell is written on purpose), then the environment (quoted values)."""
    return [
        *(f"module load {shlex.quote(module)}" for module in profile.modules),
        *profile.setup,
        *recipe.setup,
        *_exports({**profile.network_env, **profile.env, **recipe.env}),
    ]


def srun_args(recipe: ResolvedRecipe) -> list[str]:
    srun = recipe.srun
    args = [f"--kill-on-bad-exit={int(srun.kill_on_bad_exit)}"]
    args += [f"--wait={srun.wait}"] if srun.wait is not None else []
    args += [
        f"--{flag}={value}"
        for flag, value in (("mpi", srun.mpi), ("distribution", srun.distribution), ("cpu-bind", srun.cpu_bind))
        if value
    ]
    args += ["--label"] if srun.label else []
    return args + [f"--{flag}" if value is True else f"--{flag}={value}" for flag, value in srun.extra.items()]


def _sbatch_extras(recipe: ResolvedRecipe) -> dict[str, Any]:
    """sbatch options submitit has no parameter of its own for, as ``--flag=value`` (True: ``--flag``)."""
    resources = recipe.resources
    extra: dict[str, Any] = {
        "reservation": resources.reservation,
        "time-min": resources.time_min,
        "wait-all-nodes": 1 if resources.wait_all_nodes else None,
    }
    return {flag: value for flag, value in {**extra, **resources.extra_sbatch}.items() if value is not None}


def executor_parameters(recipe: ResolvedRecipe, profile: ClusterProfile, executor: str) -> ExecutorParameters:
    """The recipe and profile as submitit's parameters (the refusals checked first: :func:`refusals`)."""
    resources = recipe.resources
    gpus = resources.gpus_per_node
    common: dict[str, Any] = {
        "name": recipe.name,
        "nodes": resources.nodes,
        "tasks_per_node": gpus,  # one task per GPU (per process standing in for one on a CPU cluster)
        "cpus_per_task": resources.cpus_per_task,
    }
    if resources.time is not None:  # the local executor's limit; SLURM is given the text itself
        common["timeout_min"] = max(1, math.ceil(slurm_time_minutes(resources.time)))
    if executor == LOCAL:
        # submitit's LocalExecutor shows its tasks gpus_per_node GPUs (CUDA_VISIBLE_DEVICES), none if not given.
        gpus_shown = {"gpus_per_node": gpus} if profile.accelerator == "gpu" else {}
        return ExecutorParameters(LOCAL, {**common, **gpus_shown, "local_setup": setup_lines(recipe, profile)})
    slurm: dict[str, Any] = {
        "slurm_time": resources.time,
        "slurm_mem": resources.mem,
        "slurm_partition": resources.partition,
        "slurm_account": resources.account,
        "slurm_qos": resources.qos,
        "slurm_constraint": resources.constraint,
        "slurm_exclusive": True if resources.exclusive else None,
        "slurm_setup": setup_lines(recipe, profile),
        "slurm_srun_args": srun_args(recipe),
        "slurm_additional_parameters": _sbatch_extras(recipe),
    }
    if profile.gpu_request == "gres":
        slurm["slurm_gres"] = f"gpu:{gpus}"
    elif profile.gpu_request == "gpus-per-node":
        common["gpus_per_node"] = gpus
    return ExecutorParameters(SLURM, {**common, **{key: value for key, value in slurm.items() if value is not None}})

"""``resources.extra_sbatch`` against sbatch's own options and the header clusterkit writes: the
options it derives, those that conflict with them, and those taken where the rest of the job allows."""

from __future__ import annotations

from clusterkit.load.job_checks import Report
from clusterkit.load.slurm_options import SBATCH_OPTIONS, SRUN_ONLY_OPTIONS
from clusterkit.spec.recipe import Recipe, process_model_of, tasks_per_node
from clusterkit.spec.resolved import ResolvedResources
from clusterkit.spec.sbatch_header import WRITTEN
from clusterkit.spec.step_options import STEP_OWNED

# #SBATCH options extra_sbatch may not set -> the recipe field that sets each: those clusterkit writes
# (spec.sbatch_header's table), and those that would undo the layout it writes.
DERIVED_SBATCH = {
    **WRITTEN,
    "ntasks": "resources.nodes and process_model (a launcher task per node, or a task per rank)",
    "gpus": "resources.gpus_per_node (the profile's gpu_request says how GPUs are asked for)",
    "chdir": "runs_dir (the job runs where it is submitted from)",
    "export": "env (every node gets the job's environment)",
}
# Options sbatch refuses beside the ones clusterkit writes, or that a clusterkit job cannot take.
CONFLICTING_SBATCH = {
    "cpus-per-gpu": "conflicts with the --cpus-per-task clusterkit writes; set resources.cpus_per_task",
    "ntasks-per-gpu": "conflicts with one launcher task per node; set resources.gpus_per_node",
    "wait": "makes sbatch block until the job ends, which a clusterkit submit must not do; for srun's --wait "
    "(seconds to wait for the other tasks once one exits) set srun.wait",
}
# SLURM's memory options, mutually exclusive: a job gives one of them (clusterkit writes --mem from
# resources.mem or the profile's mem_per_node, where either is set).
MEMORY_OPTIONS = ("mem", "mem-per-cpu", "mem-per-gpu")
# Options extra_sbatch may set where the rest of the job allows (checked below); their prefixes
# are refused like those of the options clusterkit owns.
CHECKED_SBATCH = ("gpus-per-task", "mem-per-cpu", "mem-per-gpu")


def check_extra_sbatch(recipe: Recipe, resources: ResolvedResources, error: Report, warn: Report) -> None:
    for flag in sorted(recipe.resources.extra_sbatch):
        key = ("resources", "extra_sbatch", flag)
        if flag in SRUN_ONLY_OPTIONS or flag in STEP_OWNED and flag not in SBATCH_OPTIONS:
            error(
                key,
                f"--{flag} is an srun option, not an sbatch one; set it for the launch step under "
                f"{STEP_OWNED.get(flag, 'srun.extra').split(' ')[0]}",
            )
        elif flag in DERIVED_SBATCH:
            error(key, f"--{flag} is written by clusterkit; set {DERIVED_SBATCH[flag]} instead")
        elif flag in CONFLICTING_SBATCH:
            error(key, f"--{flag} {CONFLICTING_SBATCH[flag]}")
        elif flag in CHECKED_SBATCH:
            if problem := _checked_problem(flag, recipe, resources):
                error(key, problem)
        elif flag not in SBATCH_OPTIONS and (
            owned := [name for name in (*DERIVED_SBATCH, *CONFLICTING_SBATCH, *CHECKED_SBATCH) if name.startswith(flag)]
        ):
            # sbatch takes any unambiguous prefix of a long option (an exact name wins): --out is --output.
            error(key, f"--{flag} abbreviates --{owned[0]} (sbatch accepts prefixes); write the full option name")
        elif flag not in SBATCH_OPTIONS:
            warn(
                key,
                f"--{flag} is not an sbatch option SLURM documents; sbatch will refuse the job unless a "
                "site plugin adds it",
            )


def _checked_problem(flag: str, recipe: Recipe, resources: ResolvedResources) -> str | None:
    if recipe.resources.extra_sbatch[flag] is False:
        return None  # false removes the option: nothing is written
    if flag == "gpus-per-task":
        return _gpus_per_task_problem(recipe.resources.extra_sbatch[flag], recipe, resources.gpus_per_node)
    extra = recipe.resources.extra_sbatch
    # A pair is reported once, at the later option of MEMORY_OPTIONS.
    for other in MEMORY_OPTIONS[: MEMORY_OPTIONS.index(flag)]:
        if other == "mem" and resources.mem is not None:
            own = recipe.resources.mem is not None
            source = "resources.mem" if own else "the cluster profile's mem_per_node"
            return (
                f"--{flag} and the --mem={resources.mem} clusterkit writes from {source} are mutually exclusive "
                f"in SLURM; {'keep one of them' if own else 'give the memory per node in resources.mem instead'}"
            )
        if other != "mem" and extra.get(other, False) is not False:
            return f"--{flag} and --{other} are mutually exclusive in SLURM; keep one of them"
    return None


def _gpus_per_task_problem(value: object, recipe: Recipe, gpus: int) -> str | None:
    """--gpus-per-task must give each srun task of the layout the GPUs it has: a launcher per node
    all the node's, a task per GPU one; a launcher in the batch shell spreads a node's GPUs itself."""
    model = process_model_of(recipe)
    ranks = f"{gpus} rank{'s' if gpus > 1 else ''}"
    if model == "task_per_gpu":
        if str(value) != "1":
            return "a task per GPU (launcher: python) binds one GPU to each task: gpus-per-task must be 1"
    elif tasks_per_node(model, gpus) == 1:
        if str(value) != str(gpus):
            return (
                f"one launcher task per node (launcher {recipe.launcher}) starts the node's {ranks} and needs its "
                f"{gpus} GPU{'s' if gpus > 1 else ''}: gpus-per-task must be {gpus}, or leave it out"
            )
    elif gpus > 1 or str(value) != "1":
        return (
            f"launcher {recipe.launcher} starts the node's {ranks} itself and hands each its GPU; per-task GPUs "
            "would hide the others from it: set resources.gpus_per_node"
        )
    return None

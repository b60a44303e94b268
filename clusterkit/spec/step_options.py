"""The srun options of a launch step (and the preflight's), each from the recipe field that owns
it, and the ones the supervisor gives every step: a recipe may not give any of them again in
``srun.extra`` (:data:`STEP_OWNED` names the field to use instead)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

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

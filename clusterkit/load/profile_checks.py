"""``profile:`` (spec.profiling): every setting is applied by the job or refused here, never ignored.
The built-in runner marks the steps, so only a task.trainer job can be profiled; nsys is NVIDIA's
GPU tool and needs a launcher that can start each rank under it."""

from __future__ import annotations

from clusterkit.load.job_checks import Report
from clusterkit.spec.launchers import LAUNCHERS
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe

_KEY = ("profile",)


def check_profile(recipe: Recipe, profile: ClusterProfile, world_size: int, error: Report) -> None:
    spec = recipe.profile
    if spec is None:
        return
    if recipe.task.trainer is None:
        error(
            _KEY,
            "the built-in runner (task.trainer) marks the steps to profile; a script profiles itself "
            "(torch.profiler or torch.cuda.profiler in its loop): leave profile out",
        )
    if not isinstance(recipe.preflight, bool) and recipe.preflight.only:
        error(_KEY, "preflight.only runs the benchmark and no training: there are no steps to profile")
    for index, rank in enumerate(spec.ranks):
        if rank >= world_size:
            error(("profile", "ranks", index), f"rank {rank} is not in the job: its ranks are 0-{world_size - 1}")
    first, last = spec.first_last
    steps = ("profile", "steps")
    if first < 1:
        error(steps, f"{spec.steps}: steps count from 1 (the Trainer's global_step after the first optimizer step)")
    elif last < first:
        error(steps, f"{spec.steps} is reversed: write {last}-{first}")
    elif recipe.task.trainer is not None:
        max_steps = recipe.task.trainer.args.get("max_steps")
        if isinstance(max_steps, int) and 0 < max_steps < last:
            error(steps, f"step {last} is past task.trainer.args.max_steps ({max_steps}): training ends before it")
    if spec.kind == "nsys":
        _check_nsys(recipe, profile, error)


def _check_nsys(recipe: Recipe, profile: ClusterProfile, error: Report) -> None:
    kind = ("profile", "kind")
    if profile.accelerator != "gpu":
        error(kind, f"nsys profiles GPU work and cluster '{profile.name}' has no GPUs: use kind: torch")
    elif profile.gpu_vendor != "nvidia":
        error(kind, f"nsys is NVIDIA's and cluster '{profile.name}' has {profile.gpu_vendor} GPUs: use kind: torch")
    if not LAUNCHERS[recipe.launcher].wraps_ranks:
        wrapping = ", ".join(name for name, launcher in LAUNCHERS.items() if launcher.wraps_ranks)
        error(
            kind,
            f"nsys must start each rank, which clusterkit does under launcher {wrapping}, not "
            f"{recipe.launcher}: change the launcher or use kind: torch",
        )

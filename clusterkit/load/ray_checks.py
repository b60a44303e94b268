"""launcher: ray, in one place: what does not combine with a Ray cluster on the allocation is refused
with one line each. Ray's driver schedules its own work on the nodes (placement groups, actors), so
clusterkit's parallelism layout, its spare nodes, the preflight (clusterkit's collective benchmark),
a service role and a fixed rendezvous port have nothing to act on; containers and the steps of a
job of several steps are not supported with it yet."""

from __future__ import annotations

from clusterkit.load.job_checks import Report
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe
from clusterkit.spec.runtime_values import BATCH, placeholders, when

_DRIVER = "launcher: ray runs the task's script once as Ray's driver, which places its own work on the nodes"


def check_ray(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> None:
    for index, step in enumerate(recipe.steps or []):
        if step.launcher == "ray":
            error(("steps", index, "launcher"), "launcher: ray is not supported in a job of several steps yet")
    if recipe.launcher != "ray":
        return
    parallelism = recipe.parallelism
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(parallelism, name) != 1:
            error(("parallelism", name), f"{_DRIVER}: clusterkit cannot apply {name}; set it in the driver")
    if parallelism.dp != "auto":
        error(("parallelism", "dp"), f"{_DRIVER}: clusterkit cannot apply dp; set it in the driver")
    if parallelism.zero_stage or parallelism.fsdp is not None:
        key = "zero_stage" if parallelism.zero_stage else "fsdp"
        error(("parallelism", key), f"{_DRIVER}: its workers set up ZeRO/FSDP themselves (e.g. verl's config)")
    if recipe.deepspeed.config is not None or recipe.deepspeed.enabled:
        error(("deepspeed",), f"{_DRIVER}: its workers start DeepSpeed themselves")
    if recipe.resources.spare_nodes:
        error(
            ("resources", "spare_nodes"),
            "launcher: ray puts a Ray node on every node of the allocation; spare nodes are not supported with it",
        )
    preflight = recipe.preflight if isinstance(recipe.preflight, bool) else recipe.preflight.enabled
    if preflight:
        error(("preflight",), "the preflight (torch.distributed ranks) is not supported with launcher: ray")
    if recipe.service is not None:
        error(("service",), "a service role is not supported with launcher: ray yet (run it as a Ray actor)")
    if recipe.components:
        error(
            ("components",),
            "heterogeneous components are not supported with launcher: ray yet (run them as Ray actors)",
        )
    if recipe.master_port is not None:
        error(("master_port",), "launcher: ray chooses the head's port itself (outside Ray's worker ports)")
    if profile.container is not None:
        profile_error(("container",), "containers are not supported with launcher: ray yet")
    for index, arg in enumerate(recipe.task.args):
        if later := sorted(name for name in placeholders(arg) if when(name) != BATCH):
            error(
                ("task", "args", index),
                f"{{{later[0]}}} is known only on a node or in a rank; launcher: ray runs the driver once, in the "
                "batch shell: use {job_id}, {run_dir} or {env:NAME} here",
            )

"""A heterogeneous job's checks (``components:``, spec.components): each component's names, options
and env, reported at its own keys, and what a recipe with components cannot carry, refused here in
one place with why."""

from __future__ import annotations

from clusterkit.load.job_checks import Report, env_owner, shell_env_problem
from clusterkit.load.launch_checks import env_texts
from clusterkit.load.slurm_options import SBATCH_OPTIONS, SRUN_OPTIONS
from clusterkit.spec.components import COMPONENT_SBATCH, COMPONENT_SRUN, JOB_WIDE_SBATCH, RESERVED_NAMES
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe, process_model_of

# What cannot combine with components yet, each with why: key in the recipe -> (is it set, why not).
_REFUSED = (
    (("service",), lambda r, p: r.service is not None, "a service role shares training's allocation; "
     "give the service as a component instead"),
    (("steps",), lambda r, p: r.steps is not None, "a job of several steps with components is not supported yet"),
    (("resources", "array"), lambda r, p: r.resources.array is not None, "SLURM runs no job array of "
     "heterogeneous jobs"),
    (("sweep",), lambda r, p: r.sweep is not None, "a sweep is a job array, and SLURM runs no job array of "
     "heterogeneous jobs"),
    (("resources", "spare_nodes"), lambda r, p: r.resources.spare_nodes > 0, "hot spares with components are "
     "not supported yet"),
    (("launcher",), lambda r, p: process_model_of(r) == "batch_launcher", "a launcher in the batch shell starts "
     "its own srun steps, which would not know the components' groups; use a launcher per node or per rank"),
    (("container_image",), lambda r, p: r.container_image is not None or p.container is not None,
     "components do not run in containers yet; use a cluster profile without container:"),
)  # fmt: skip


def check_components(
    recipe: Recipe, profile: ClusterProfile, error: Report, warn: Report, profile_error: Report
) -> None:
    components = recipe.components
    if not components:
        return
    for key, is_set, why in _REFUSED:
        if is_set(recipe, profile):
            error(key, f"cannot be combined with components: {why}")
    # sbatch keeps no empty line of a heterogeneous job's script: a value with one would lose it.
    for report, base, env in (
        (error, ("env",), recipe.env),
        (error, ("network", "env"), recipe.network.env),
        (profile_error, ("env",), profile.env),
        (profile_error, ("network_env",), profile.network_env),
    ):
        for name, value in env.items():
            if any("\n\n" in text for text in env_texts(value)):
                report((*base, name), "holds an empty line, which SLURM drops from a heterogeneous job's script")
    seen: set[str] = set()
    for index, component in enumerate(components):
        at = ("components", index)
        if component.name in RESERVED_NAMES:
            error((*at, "name"), f"{component.name!r} is clusterkit's own name (training is 'train'); choose another")
        elif component.name in seen:
            error((*at, "name"), f"{component.name!r} is the name of an earlier component; each needs its own")
        seen.add(component.name)
        if component.gpus_per_node is not None and profile.accelerator != "gpu":
            error((*at, "gpus_per_node"), f"cluster profile {profile.name!r} has no GPUs")
        for flag in sorted(component.sbatch):
            owned = JOB_WIDE_SBATCH.get(flag) or COMPONENT_SBATCH.get(flag)
            if owned:
                error((*at, "sbatch", flag), f"--{flag} is not the component's to set; set {owned} instead")
            elif flag not in SBATCH_OPTIONS:
                warn((*at, "sbatch", flag), f"--{flag} is not an sbatch option SLURM documents")
        for flag in sorted(component.srun):
            if flag in COMPONENT_SRUN:
                error((*at, "srun", flag), f"--{flag} is given by clusterkit; set {COMPONENT_SRUN[flag]} instead")
            elif flag not in SRUN_OPTIONS:
                warn((*at, "srun", flag), f"--{flag} is not an srun option SLURM documents")
        for name in sorted(component.env):
            if who := env_owner(name):
                error((*at, "env", name), f"{name} is set by {who}; choose another name")
            elif problem := shell_env_problem(name):
                error((*at, "env", name), problem)
        if component.ready_timeout_s != 600 and component.port is None:
            error((*at, "ready_timeout_s"), "waits for the component's port: give port too")

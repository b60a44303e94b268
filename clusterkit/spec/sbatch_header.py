"""The job's ``#SBATCH`` header, from the resolved recipe and profile: one table of the options
clusterkit writes, each with the recipe field that sets it and how its value is derived. The header
is built from the table, and the recipe check that refuses these options in ``extra_sbatch`` reads
the same table (:data:`WRITTEN`), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterkit.spec import containers, layout
from clusterkit.spec.notify import mail_type

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

BARE = True  # a value that writes the flag alone (#SBATCH --exclusive)
_RESOURCES = "resources."
_GPUS = "resources.gpus_per_node (the profile's gpu_request says how GPUs are asked for)"
_MAIL = "notify.email and notify.events"


@dataclass(frozen=True)
class HeaderOption:
    flag: str
    field: str  # what sets it, as an error names it
    value: Callable[[ResolvedRecipe, ClusterProfile], Any]  # None: not written; BARE: the flag alone
    # Only clusterkit writes it (extra_sbatch may not); False: extra_sbatch may, where the field is unset.
    owned: bool = True


def total_nodes(recipe: ResolvedRecipe) -> int:
    """Training's nodes, its spares, then the service's."""
    return recipe.resources.nodes + recipe.resources.spare_nodes + (recipe.service.nodes if recipe.service else 0)


def tasks_per_node(recipe: ResolvedRecipe) -> int:
    """srun tasks per node: the node's launcher, or one task per rank."""
    return 1 if recipe.process_model == "launcher_per_node" else recipe.ranks_per_node


def _log(stream: str) -> Callable[[ResolvedRecipe, ClusterProfile], str]:
    def path(recipe: ResolvedRecipe, profile: ClusterProfile) -> str:
        kind = recipe.job_kind  # SLURM fills in the ids
        return f"{recipe.runs_dir}/{recipe.name}/{layout.RUN_DIR_PATTERN[kind]}/{layout.batch_log(layout.JOB_ID_PATTERN[kind], stream)}"

    return path


def _requeue(wanted: bool) -> Callable[[ResolvedRecipe, ClusterProfile], Any]:
    def flag(recipe: ResolvedRecipe, profile: ClusterProfile) -> Any:
        requeue = recipe.preemption.requeue
        if requeue == "auto":  # requeued on preemption (a retry after a failure is a new job)
            requeue = bool(recipe.preemption.max_requeues)
        return BARE if requeue is wanted else None  # site: neither flag, the site's JobRequeue decides

    return flag


def _resource(name: str) -> HeaderOption:
    return HeaderOption(name.replace("_", "-"), _RESOURCES + name, lambda r, p: getattr(r.resources, name))


HEADER: tuple[HeaderOption, ...] = (
    HeaderOption("job-name", "name", lambda r, p: r.name),
    HeaderOption("nodes", _RESOURCES + "nodes", lambda r, p: total_nodes(r)),
    HeaderOption(
        "ntasks-per-node",
        "process_model and resources.gpus_per_node (a launcher task per node, or a task per rank)",
        lambda r, p: tasks_per_node(r),
    ),
    _resource("cpus_per_task"),
    HeaderOption("output", "runs_dir (logs go to the run directory)", _log("out")),
    HeaderOption("error", "runs_dir (logs go to the run directory)", _log("err")),
    HeaderOption("open-mode", "runs_dir (the job's logs are appended to by every node)", lambda r, p: "append"),
    HeaderOption(
        "gres",
        _GPUS,
        lambda r, p: f"gpu:{r.resources.gpus_per_node}" if p.accelerator == "gpu" and p.gpu_request == "gres" else None,
    ),
    HeaderOption(
        "gpus-per-node",
        _GPUS,
        lambda r, p: r.resources.gpus_per_node if p.accelerator == "gpu" and p.gpu_request == "gpus-per-node" else None,
    ),
    *map(_resource, ("mem", "time", "partition", "account", "qos", "constraint", "reservation", "time_min")),
    # The warning signal goes to the batch shell (B:), whose supervisor passes it to the ranks.
    HeaderOption(
        "signal",
        "preemption.signal and preemption.grace_s",
        lambda r, p: (
            f"B:{r.preemption.handled_signal}@{r.preemption.grace_s}" if r.preemption.signal is not False else None
        ),
    ),
    # Shifter stages the image on the job's nodes before it starts (its SLURM plugin reads this).
    HeaderOption(
        "image",
        "the cluster profile's container (runtime: shifter)",
        lambda r, p: containers.header_image(r.container),
    ),
    HeaderOption("requeue", "preemption.requeue", _requeue(True)),
    HeaderOption("no-requeue", "preemption.requeue", _requeue(False)),
    HeaderOption(
        "wait-all-nodes", _RESOURCES + "wait_all_nodes", lambda r, p: 1 if r.resources.wait_all_nodes else None
    ),
    HeaderOption("exclusive", _RESOURCES + "exclusive", lambda r, p: BARE if r.resources.exclusive else None),
    HeaderOption(
        "array",
        "resources.array (a script task per index), or a sweep: block / clusterkit sweep (one point per task)",
        lambda r, p: r.array.spec if r.array else None,
    ),
    # SLURM's own e-mail, for clusters whose nodes cannot reach a webhook (load.job_checks refuses
    # these in extra_sbatch only beside notify.email).
    HeaderOption("mail-type", _MAIL, lambda r, p: mail_type(r.notify), owned=False),
    HeaderOption("mail-user", _MAIL, lambda r, p: r.notify.email if mail_type(r.notify) else None, owned=False),
)
WRITTEN = {option.flag: option.field for option in HEADER if option.owned}  # what extra_sbatch may not set
MAIL_OPTIONS = {option.flag: option.field for option in HEADER if option.field == _MAIL}


def header_options(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[tuple[str, Any | None]]:
    """Every #SBATCH option as (flag, value), value None for a bare flag, sorted by flag; the
    recipe's extra_sbatch last (false removes one clusterkit would write)."""
    options: dict[str, Any] = {}
    for option in HEADER:
        value = option.value(recipe, profile)
        if value is not None:
            options[option.flag] = None if value is BARE else value
    for flag, value in recipe.resources.extra_sbatch.items():
        if value is False:
            options.pop(flag, None)
        else:
            options[flag] = None if value is True else value
    return sorted(options.items())

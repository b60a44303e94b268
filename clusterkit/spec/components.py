"""Programs beside training: the same-allocation service role (``service:``), and heterogeneous
jobs' components (``components:``).

A heterogeneous job's components: programs beside training, each in a SLURM heterogeneous job
component of its own (an ``#SBATCH hetjob`` group with its own nodes, partition, GPUs and ranks per
node), started by the job's supervisor as an ``srun --het-group=N`` step before training and stopped
when training ends. Training is the recipe's own task and resources: het group 0, component ``train``.

Every process of the job (training's ranks, and each component's) is told where every component
runs (clusterkit.supervisor.components names the variables; docs/guides/heterogeneous-jobs.md).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Union

import msgspec
from msgspec import Meta, field

from clusterkit.spec.text import END, LINE_PATTERN, NON_EMPTY_LINE_PATTERN
from clusterkit.supervisor.components import TRAIN

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

# Lower case: a component's variables are CLUSTERKIT_COMPONENT_<NAME upper-cased>_*, one name each.
COMPONENT_NAME_PATTERN = f"^[a-z][a-z0-9_]{{0,31}}{END}"
COMPONENT_PATTERN_HINTS = {
    COMPONENT_NAME_PATTERN: "lower-case letters, digits and '_', starting with a letter, at most 32",
}
# Names a component may not take: training's, and the plan's own steps' (the node agent finds steps by name).
RESERVED_NAMES = (TRAIN, "launch", "preflight", "service", "image-check")

# The same patterns as spec.recipe's (their hints are keyed by the pattern text); this module cannot
# import spec.recipe, which imports it (and re-exports Service).
_ENV_NAME = Annotated[str, Meta(pattern=f"^[A-Za-z_][A-Za-z0-9_]*{END}")]
_FLAG = Annotated[str, Meta(pattern=f"^[a-z][a-z0-9-]*{END}")]
_OPTION_VALUE = Union[Annotated[str, Meta(pattern=LINE_PATTERN)], int, bool]
_ENV_VALUE = Union[Annotated[str, Meta(pattern=rf"^[^\x00]*{END}")], int, float, bool]
_LINE = Annotated[str, Meta(min_length=1, pattern=NON_EMPTY_LINE_PATTERN)]


class Service(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    """A service role (an inference server, a reward model) on nodes of its own in the same allocation:
    ``command`` runs once per service node in an srun step of its own, training runs on the other
    nodes (world size, hostfile and rendezvous are the training nodes') and starts only once the
    service answers on ``port``; the service is stopped when training ends."""

    command: Annotated[list[_LINE], Meta(min_length=1)]  # argv, each item one word
    port: Annotated[int, Meta(ge=1, le=65535)]
    # Beside resources.nodes (the training nodes); the allocation's last ones.
    nodes: Annotated[int, Meta(ge=1, le=1_000_000)] = 1
    ready_timeout_s: Annotated[int, Meta(ge=1, le=86_400)] = 600
    # The variable that tells training where the service is: <first service host>:<port>.
    address_env: _ENV_NAME = "SERVICE_ADDR"


class Component(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    """One heterogeneous job component: ``command`` run once per rank (``ranks_per_node`` on each of
    its ``nodes``) in an srun step of its own, on nodes SLURM allocates for it alone. With ``port``,
    training starts only once the component's first node answers there."""

    name: Annotated[str, Meta(pattern=COMPONENT_NAME_PATTERN)]
    command: Annotated[list[_LINE], Meta(min_length=1)]  # argv, each item one word, exec'd as written
    nodes: Annotated[int, Meta(ge=1, le=1024)] = 1
    ranks_per_node: Annotated[int, Meta(ge=1, le=256)] = 1
    gpus_per_node: Annotated[int, Meta(ge=1, le=64)] | None = None  # none: no GPUs
    cpus_per_task: Annotated[int, Meta(ge=1, le=1024)] | None = None  # per rank; none: SLURM's default
    partition: _LINE | None = None  # default: the recipe's resources.partition
    # Any other #SBATCH option of this component (mem, account, qos, constraint, ...): flag -> value,
    # true for a bare flag. Job-wide options and the ones the fields above write are refused.
    sbatch: dict[_FLAG, _OPTION_VALUE] = field(default_factory=dict)
    # Options of this component's srun step, flag -> value (true: the bare flag), e.g. mpi: pmix.
    srun: dict[_FLAG, _OPTION_VALUE] = field(default_factory=dict)
    env: dict[_ENV_NAME, _ENV_VALUE] = field(default_factory=dict)  # set for this component's ranks
    port: Annotated[int, Meta(ge=1, le=65535)] | None = None  # readiness: a TCP connect to the first node's
    ready_timeout_s: Annotated[int, Meta(ge=1, le=86_400)] = 600


# What a component's #SBATCH options may not say: the job's (one for the whole job, from the
# recipe), and what its fields write; each with where to say it instead.
JOB_WIDE_SBATCH = {
    flag: "the recipe's own field (one value for the whole heterogeneous job)"
    for flag in (
        "job-name", "output", "error", "open-mode", "signal", "array", "requeue", "no-requeue", "time",
        "time-min", "dependency", "mail-type", "mail-user", "chdir", "export", "hold", "parsable",
        "wait-all-nodes", "hetjob", "packjob", "het-group", "image",
    )
}  # fmt: skip
COMPONENT_SBATCH = {
    "nodes": "nodes",
    "ntasks": "nodes and ranks_per_node",
    "ntasks-per-node": "ranks_per_node",
    "gres": "gpus_per_node",
    "gpus": "gpus_per_node",
    "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "cpus_per_task",
    "partition": "partition",
}
# What the supervisor gives a component's srun step (clusterkit.supervisor.steps.srun_argv).
COMPONENT_SRUN = {
    **{flag: field for flag, field in COMPONENT_SBATCH.items() if flag != "partition"},
    "nodelist": "nodes (the component's own nodes)",
    "het-group": "the component's place in components:",
    "output": "runs_dir (its log is in the run directory)",
    "error": "runs_dir (its log is in the run directory)",
    "open-mode": "nothing: the logs are appended to",
}


def het_group(recipe: ResolvedRecipe, name: str) -> int:
    """A component's heterogeneous job group: training's is 0, the components' 1, 2, ... in order."""
    return 0 if name == TRAIN else 1 + [c.name for c in recipe.components or []].index(name)


def component_log(name: str, task: int | str, stream: str) -> str:
    """``component_<name>_<task>.out|err``: a component's output, one file per rank (srun's %t)."""
    return f"component_{name}_{task}.{stream}"


def header_groups(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[list[tuple[str, Any | None]]]:
    """Each component's #SBATCH options after its ``#SBATCH hetjob`` line, as (flag, value), value
    None for a bare flag: its layout, partition and GPUs, then its own ``sbatch:`` options."""
    groups = []
    for component in recipe.components or []:
        options: dict[str, Any] = {
            "nodes": component.nodes,
            "ntasks-per-node": component.ranks_per_node,
            "cpus-per-task": component.cpus_per_task,
            "partition": component.partition or recipe.resources.partition,
        }
        # As training's GPUs are asked for (spec.sbatch_header): gres, gpus-per-node, or none (the site's way).
        if component.gpus_per_node is not None and profile.gpu_request == "gres":
            options["gres"] = f"gpu:{component.gpus_per_node}"
        elif component.gpus_per_node is not None and profile.gpu_request == "gpus-per-node":
            options["gpus-per-node"] = component.gpus_per_node
        for flag, value in component.sbatch.items():
            options[flag] = None if value is True else value
        groups.append(sorted((f, v) for f, v in options.items() if v is not None and v is not False))
    return groups


def without_empty_lines(script: str) -> str:
    """A heterogeneous job's script as SLURM keeps it: sbatch drops its empty lines as it splits the
    hetjob groups, so the script clusterkit writes (and its dry run shows) has none, and load refuses
    an env value with an empty line in it, whose meaning that would change (load.component_checks)."""
    return re.sub("\n{2,}", "\n", script)  # lines as bash and sbatch split them: at \n alone

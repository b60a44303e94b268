"""What a SLURM cluster's partitions hold and have free, from one ``sinfo`` call: per partition the
GPU types (GRES ``gpu``, typed or not), GPUs per node, free and total GPUs and nodes, how many
nodes are idle, mixed, allocated or unavailable (drained, down, not responding), and the time
limit; and whether a job of N nodes x G GPUs for T could start now, later, or never there.

A node's free GPUs are its GRES less GresUsed, and only while it takes jobs: the GPUs of a drained
or down node are not free. ``clusterkit gpus`` prints this; ``submit --test-only`` asks it for
"never"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterkit.errors import SchedulerError
from clusterkit.schedulers.host import Host, checked, without_env
from clusterkit.spec.timefmt import slurm_time_minutes

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile
    from clusterkit.spec.resolved import ResolvedRecipe

# sinfo --Format fields, each printed whole (size 0) and ended by "|" (no field's value holds one:
# GRES, states, times and numbers do not, and SLURM's names are words).
_SINFO_FIELDS = ("NodeList", "PartitionName", "Partition", "StateLong", "Gres", "GresUsed", "CPUs", "Time")
SINFO_FORMAT = ",".join(f"{name}:0|" for name in _SINFO_FIELDS)

# sinfo takes filters, formats and a sort from the environment too (a user's SINFO_PARTITION=gpu
# would hide partitions, SINFO_FORMAT change the lines); none of them applies here.
_SINFO_ENV = (
    "SINFO_ALL",
    "SINFO_FEDERATION",
    "SINFO_FORMAT",
    "SINFO_LOCAL",
    "SINFO_PARTITION",
    "SINFO_SORT",
    "SLURM_TIME_FORMAT",
)

IDLE, MIXED, ALLOCATED, UNAVAILABLE = "idle", "mixed", "allocated", "unavailable"
# StateLong's base word -> what it means for a new job. A suffix says more: "*" not responding
# (unavailable whatever the word), "~" powered off and "#" powering up (a cloud node: it starts on
# demand), "$" in a maintenance reservation, "@" a reboot pending, "-" planned for a waiting job.
_NODE_STATES = {
    "idle": IDLE,
    "mixed": MIXED,
    "allocated": ALLOCATED,
    "completing": ALLOCATED,
    "planned": ALLOCATED,  # kept free for a higher-priority job that backfill has placed there
    "reserved": ALLOCATED,  # in an advance reservation: only its jobs
}
_NOT_RESPONDING = "*"


@dataclass(frozen=True)
class NodeGpus:
    """One node as one partition has it (a node in two partitions is two of these)."""

    node: str
    partition: str
    default: bool  # the cluster's default partition
    state: str  # IDLE, MIXED, ALLOCATED or UNAVAILABLE
    slurm_state: str  # sinfo's StateLong, e.g. "drained", "idle~", "down*"
    gpu_types: tuple[str, ...]  # the GRES gpu types it has ("" for untyped GPUs)
    gpus: int
    gpus_used: int
    cpus: int
    time_limit: str  # sinfo's, e.g. "infinite", "1-00:00:00"

    @property
    def gpus_free(self) -> int:
        return max(self.gpus - self.gpus_used, 0) if self.state in (IDLE, MIXED) else 0


@dataclass(frozen=True)
class PartitionGpus:
    name: str
    default: bool
    nodes: tuple[NodeGpus, ...]
    time_limit: str

    @property
    def time_limit_minutes(self) -> float | None:
        """None: no limit (infinite) or one sinfo did not say."""
        return time_minutes(self.time_limit)

    @property
    def gpu_types(self) -> list[str]:
        return sorted({kind for node in self.nodes for kind in node.gpu_types})

    @property
    def gpus_per_node(self) -> list[int]:
        return sorted({node.gpus for node in self.nodes})

    def count(self, state: str) -> int:
        return sum(node.state == state for node in self.nodes)

    def to_json(self) -> dict:
        return {
            "partition": self.name,
            "default": self.default,
            "gpu_types": self.gpu_types,
            "gpus_per_node": self.gpus_per_node,
            "gpus_total": sum(node.gpus for node in self.nodes),
            "gpus_free": sum(node.gpus_free for node in self.nodes),
            "nodes_total": len(self.nodes),
            "nodes_free": sum(node.state == IDLE for node in self.nodes),
            "nodes_idle": self.count(IDLE),
            "nodes_mixed": self.count(MIXED),
            "nodes_allocated": self.count(ALLOCATED),
            "nodes_unavailable": self.count(UNAVAILABLE),
            "time_limit": self.time_limit,
            "time_limit_minutes": self.time_limit_minutes,
        }


def sinfo_argv() -> list[str]:
    """sinfo: one line per node and partition, untouched by the user's SINFO_* settings."""
    return without_env(
        _SINFO_ENV,
        [
            "sinfo",
            "--noheader",
            "--Node",
            f"--Format={SINFO_FORMAT}",
        ],
    )


def time_minutes(text: str) -> float | None:
    """Minutes in sinfo's time limit; None for "infinite", "n/a" or anything else not a time."""
    try:
        return slurm_time_minutes(text)
    except (ValueError, IndexError):
        return None


def _gres_items(text: str) -> list[str]:
    """A GRES list split at the commas between items, not those inside "(IDX:0,2)"."""
    items, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:at])
            start = at + 1
    return [*items, text[start:]]


def gpu_gres(text: str) -> list[tuple[str, int]]:
    """The ``gpu`` items of a GRES or GresUsed text as (type, count): ``gpu:h100:8(S:0-1)`` ->
    [("h100", 8)], ``gpu:2`` -> [("", 2)]; other kinds (mps, shard, nic) and "(null)" -> none."""
    found = []
    for item in _gres_items(text.strip()):
        words = re.sub(r"\([^()]*\)$", "", item.strip()).split(":")  # less "(S:0-1)", "(IDX:0,2)"
        if words[0] != "gpu" or len(words) not in (2, 3):
            continue
        kind = words[1] if len(words) == 3 and words[1] != "(null)" else ""
        count = re.match(r"[0-9]+", words[-1])
        if count:
            found.append((kind, int(count.group())))
    return found


def node_state(slurm_state: str) -> str:
    word = slurm_state.strip().lower()
    if word.endswith(_NOT_RESPONDING):
        return UNAVAILABLE
    return _NODE_STATES.get(word.rstrip("~#!%$@^-+"), UNAVAILABLE)


def read_sinfo(output: str) -> list[NodeGpus]:
    """``sinfo --Node --Format`` lines as :data:`SINFO_FORMAT` asks; a line that is not one
    (a warning, a value broken over lines) is left out."""
    nodes = []
    for line in output.splitlines():
        values = line.split("|")
        if len(values) != len(_SINFO_FIELDS) + 1 or values[-1].strip():
            continue
        node, name, listed, state, gres, used, cpus, time_limit = (value.strip() for value in values[:-1])
        gpus = gpu_gres(gres)
        nodes.append(
            NodeGpus(
                node=node,
                partition=name,
                default=listed == f"{name}*",
                state=node_state(state),
                slurm_state=state,
                gpu_types=tuple(sorted({kind for kind, _ in gpus})),
                gpus=sum(count for _, count in gpus),
                gpus_used=sum(count for _, count in gpu_gres(used)),
                cpus=int(cpus) if cpus.isdigit() else 0,
                time_limit=time_limit,
            )
        )
    return nodes


def partitions(nodes: Sequence[NodeGpus]) -> list[PartitionGpus]:
    """The nodes grouped by partition, in sinfo's order."""
    grouped: dict[str, list[NodeGpus]] = {}
    for node in nodes:
        grouped.setdefault(node.partition, []).append(node)
    return [
        PartitionGpus(name, any(node.default for node in members), tuple(members), members[0].time_limit)
        for name, members in grouped.items()
    ]


def read_partitions(host: Host) -> list[PartitionGpus]:
    """The cluster's partitions as its SLURM says now (one sinfo on ``host``)."""
    found = partitions(read_sinfo(checked(host, sinfo_argv())))
    if not found:
        raise SchedulerError(f"sinfo on {host.name} lists no partition this user may submit to")
    return found


@dataclass(frozen=True)
class Asked:
    """What a job asks of each partition: nodes (spares included), GPUs on each, for how long."""

    nodes: int
    gpus_per_node: int  # 0: no GPUs asked (a CPU job, or GPUs asked some other way)
    time: str | None  # SLURM's time text; None: the partition's default

    @property
    def words(self) -> str:
        """ "2 nodes x 4 GPUs each", "1 node x no GPUs"."""
        gpus = self.gpus_per_node
        each = f"{gpus} GPU{'s' if gpus != 1 else ''} each" if gpus else "no GPUs"
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {each}"


NOW, LATER, NEVER = "now", "later", "never"


@dataclass(frozen=True)
class Fit:
    partition: str
    verdict: str  # NOW, LATER or NEVER
    why: str  # one line for a person

    def to_json(self) -> dict:
        return {"partition": self.partition, "verdict": self.verdict, "why": self.why}


def fit(partition: PartitionGpus, asked: Asked) -> Fit:
    """Whether ``asked`` could start in ``partition`` now (enough nodes taking jobs with enough
    free GPUs each), later (the partition has such nodes, busy now), or never (it has too few such
    nodes at all, or the time is over its limit)."""
    gpus, job = asked.gpus_per_node, asked.words
    limit = partition.time_limit_minutes
    minutes = time_minutes(asked.time) if asked.time else None
    if limit is not None and minutes is not None and minutes > limit:
        return Fit(
            partition.name,
            NEVER,
            f"resources.time {asked.time} is over the partition's limit {partition.time_limit}: ask for at most that",
        )
    big_enough = [node for node in partition.nodes if node.gpus >= gpus]
    if len(big_enough) < asked.nodes:
        if not gpus:
            why = f"it has {len(partition.nodes)}: lower resources.nodes, or pick another partition"
        else:
            most = max((node.gpus for node in partition.nodes), default=0)
            why = (
                f"it has {len(big_enough)} with {gpus} or more (at most {most} GPUs a node): "
                "lower resources.nodes or resources.gpus_per_node, or pick another partition"
            )
        return Fit(partition.name, NEVER, f"{job} asked; {why}")
    free = [node for node in big_enough if node.state in (IDLE, MIXED) and node.gpus_free >= gpus]
    if len(free) >= asked.nodes:
        return Fit(partition.name, NOW, f"{job}: {len(free)} node{'s' if len(free) != 1 else ''} free for it now")
    return Fit(
        partition.name,
        LATER,
        f"{job}: {len(free)} of the {asked.nodes} nodes free now; it waits for GPUs to be released",
    )


def asked_of(recipe: ResolvedRecipe, profile: ClusterProfile) -> Asked:
    """What the recipe's job asks of a partition (GPUs only where the profile asks SLURM for them)."""
    resources = recipe.resources
    gpus = resources.gpus_per_node if profile.accelerator == "gpu" and profile.gpu_request != "none" else 0
    return Asked(resources.nodes + resources.spare_nodes, gpus, resources.time)


def fits(found: Sequence[PartitionGpus], asked: Asked) -> list[Fit]:
    """``asked`` in every partition: those it could start in now first, then later, then never."""
    order = {NOW: 0, LATER: 1, NEVER: 2}
    return sorted((fit(partition, asked) for partition in found), key=lambda each: order[each.verdict])


def chosen_partition(found: Sequence[PartitionGpus], named: str | None) -> PartitionGpus | None:
    """The partition a job goes to: the one it names, else the cluster's default; None: not listed."""
    return next((p for p in found if p.name == named or (named is None and p.default)), None)

"""What a SLURM cluster is, asked of the cluster itself through a :class:`Host` (this machine, or a
login node over SSH): its partitions and nodes (``scontrol --oneliner show partition|node``), its
version (``scontrol show config``), the options its ``sbatch`` and ``srun`` take (their ``--help``:
probed, not assumed from a version) and the container tools on the login node's PATH. Six commands,
none given a value of the user's. ``clusterkit profile init`` writes a cluster profile from it
(:mod:`clusterkit.diagnose.site_profile`); everything here is the cluster's text, parsed, not judged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from clusterkit.errors import SchedulerError
from clusterkit.schedulers.host import Host, checked
from clusterkit.schedulers.slurm_queue import oneliner_fields

PARTITIONS = ("scontrol", "--oneliner", "show", "partition")
NODES = ("scontrol", "--oneliner", "show", "node")
CONFIG = ("scontrol", "show", "config")
SBATCH_HELP = ("sbatch", "--help")
SRUN_HELP = ("srun", "--help")
# Which of the container tools the login node has (a compute node may differ: said so where used).
CONTAINER_TOOLS = ("apptainer", "singularity", "shifter", "podman", "docker", "enroot")
_WHICH = ("sh", "-c", 'for tool; do command -v "$tool" >/dev/null 2>&1 && echo "$tool"; done; exit 0', "sh")
# SLURM writes these for "no value".
_NONE = {"", "(null)", "N/A", "none", "None"}


@dataclass(frozen=True)
class Gres:
    """One generic resource of a node: ``gpu:h100:8(S:0-1)`` is gpu, h100, 8."""

    name: str
    type: str | None
    count: int


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_time: str | None  # as SLURM writes it; None: UNLIMITED
    state: str


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int | None  # CPUEfctv (SLURM 23+: what jobs may use), else CPUTot
    memory_mb: int | None  # RealMemory less MemSpecLimit: what a job may ask for
    gres: tuple[Gres, ...]
    features: tuple[str, ...]  # AvailableFeatures and ActiveFeatures
    gres_text: str  # as written, for the comments


@dataclass(frozen=True)
class SlurmSite:
    partitions: tuple[Partition, ...]
    nodes: tuple[Node, ...]
    version: str | None
    sbatch_options: frozenset[str]  # long option names without dashes: gres, gpus-per-node, ...
    srun_options: frozenset[str]
    container_tools: tuple[str, ...]  # on the login node's PATH
    host: str  # where it was asked: "this machine" or the login node


def read_site(host: Host) -> SlurmSite:
    """Ask the cluster; a command that fails is one SchedulerError naming it (exit 1)."""
    partitions = read_partitions(checked(host, PARTITIONS))
    nodes = read_nodes(checked(host, NODES))
    version = read_version(checked(host, CONFIG))
    sbatch = help_options(_help(host, SBATCH_HELP))
    srun = help_options(_help(host, SRUN_HELP))
    tools = host.run([*_WHICH, *CONTAINER_TOOLS])
    found = tuple(tool for tool in tools.stdout.split() if tool in CONTAINER_TOOLS) if tools.returncode == 0 else ()
    return SlurmSite(partitions, nodes, version, sbatch, srun, found, host.name)


def _help(host: Host, argv: tuple[str, ...]) -> str:
    # Some versions print --help to stderr or exit 1 after it: the text is what counts.
    done = host.run(argv)
    text = done.stdout + done.stderr
    if not help_options(text):
        raise SchedulerError(f"{' '.join(argv)} printed no options: {(text.strip().splitlines() or ['nothing'])[-1]}")
    return text


def help_options(text: str) -> frozenset[str]:
    """The long options a ``--help`` text lists: each at a line's start (after a short option)."""
    return frozenset(re.findall(r"(?m)^\s+(?:-\w[ ,]\s*)?--([a-z][a-z0-9-]*)", text))


def _records(output: str, key: str) -> Iterator[dict[str, str]]:
    """The Key=value fields of each line of an ``scontrol --oneliner show`` that names a ``key``."""
    for line in output.split("\n"):  # SLURM's lines end so; splitlines() would also cut at \x85
        fields = oneliner_fields(line)
        if fields.get(key, "") not in _NONE:
            yield fields


def read_partitions(output: str) -> tuple[Partition, ...]:
    return tuple(_partition(fields) for fields in _records(output, "PartitionName"))


def _partition(fields: dict[str, str]) -> Partition:
    max_time = fields.get("MaxTime", "UNLIMITED")
    return Partition(
        name=fields["PartitionName"],
        default=fields.get("Default") == "YES",
        max_time=None if max_time in {"UNLIMITED", "INFINITE"} | _NONE else max_time,
        state=fields.get("State", ""),
    )


def read_nodes(output: str) -> tuple[Node, ...]:
    return tuple(_node(fields) for fields in _records(output, "NodeName"))


def _node(fields: dict[str, str]) -> Node:
    memory = _number(fields.get("RealMemory"))
    if memory is not None:
        memory -= _number(fields.get("MemSpecLimit")) or 0
    features = [
        feature
        for key in ("AvailableFeatures", "ActiveFeatures")
        for feature in fields.get(key, "").split(",")
        if feature not in _NONE
    ]
    return Node(
        name=fields["NodeName"],
        partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p not in _NONE),
        cpus=_number(fields.get("CPUEfctv")) or _number(fields.get("CPUTot")),
        memory_mb=memory,
        gres=read_gres(fields.get("Gres", "")),
        features=tuple(dict.fromkeys(features)),
        gres_text=fields.get("Gres", ""),
    )


def read_gres(text: str) -> tuple[Gres, ...]:
    """``gpu:h100:8(S:0-1),nvme:1`` → (gpu, h100, 8), (nvme, None, 1); anything else is left out."""
    found = []
    for item in re.split(r",(?![^(]*\))", text):  # commas inside "(S:0-1,3)" are not separators
        parts = re.sub(r"\(.*\)$", "", item).split(":")
        if len(parts) in (2, 3) and _number(parts[-1]) is not None and parts[0] and parts[0] not in _NONE:
            found.append(Gres(parts[0], parts[1] if len(parts) == 3 and parts[1] else None, int(parts[-1])))
    return tuple(found)


def read_version(output: str) -> str | None:
    match = re.search(r"(?m)^SLURM_VERSION\s*=\s*(\S+)", output)
    return match.group(1) if match else None


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,12}", text) else None

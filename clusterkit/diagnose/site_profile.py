"""A cluster profile from what the cluster says of itself (:class:`~clusterkit.schedulers.slurm_site.SlurmSite`):
each value with where it came from (a comment above it in the YAML), and a line for each thing the
cluster did not tell. Nothing is guessed into a value: what is not known is left out (or, for the
two required counts, the safe 1) and said so. Pure: no I/O; :mod:`clusterkit.cli.profile` asks and writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import yaml

from clusterkit.errors import SchedulerError, UsageError
from clusterkit.schedulers.slurm_site import Node, Partition, SlurmSite
from clusterkit.spec.profile import ClusterProfile, Login
from clusterkit.spec.recipe import SLURM_TIME_PATTERN
from clusterkit.spec.sbatch_header import HEADER

# GRES types whose GPU is unambiguous: (model, memory GB, vendor). An A100 or V100 comes in two
# memory sizes, so only a type that names the size is read; peak TFLOPS is never guessed (SXM and
# PCIe differ).
GPU_TYPES = {
    "h100": ("H100-80GB", 80, "nvidia"),
    "h200": ("H200-141GB", 141, "nvidia"),
    "gh200": ("GH200-96GB", 96, "nvidia"),
    "a100_80g": ("A100-80GB", 80, "nvidia"),
    "a100-80g": ("A100-80GB", 80, "nvidia"),
    "a100_40g": ("A100-40GB", 40, "nvidia"),
    "a100-40g": ("A100-40GB", 40, "nvidia"),
    "l40s": ("L40S-48GB", 48, "nvidia"),
    "a10": ("A10-24GB", 24, "nvidia"),
    "mi300x": ("MI300X-192GB", 192, "amd"),
}
# Node feature words that name the interconnect (Features=ib_ndr400,... ; the words are split at
# anything not a letter or digit).
INTERCONNECT_WORDS = (
    ("infiniband", r"infiniband|ib|(?:ib)?(?:hdr|ndr|edr|fdr|xdr)\d*"),
    ("efa", r"efa\d*"),
    ("slingshot", r"slingshot\d*|ss1[01]|cxi"),
    ("roce", r"roce\w*"),
)


@dataclass
class Draft:
    """The profile's values in the order written, each key's origin, and what was not determined."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    undetermined: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # comments at the end: what to add by hand

    def set(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = value
        self.origins[key] = origin


def draft_profile(site: SlurmSite, name: str, partition: str | None = None, login: Login | None = None) -> Draft:
    draft = Draft()
    chosen = choose_partition(site.partitions, partition)
    nodes = [node for node in site.nodes if chosen.name in node.partitions]
    if not nodes:
        nodes = list(site.nodes)
        draft.undetermined.append(
            f"nodes: no node lists partition {chosen.name} (Partitions=): every node's values are used"
        )
    if chosen.state != "UP":
        draft.undetermined.append(
            f"partition: {chosen.name} is {chosen.state or 'in no state'} (State=), not UP: jobs wait"
        )
    draft.set("name", name, "the name given to clusterkit profile init")
    draft.set(
        "description",
        f"SLURM {site.version or '(version unknown)'} partition {one_line(chosen.name)}, written by clusterkit profile init",
        "scontrol show config (SLURM_VERSION)",
    )
    _gpus(draft, site, nodes)
    _cpus_and_memory(draft, nodes)
    draft.set("partition", chosen.name, f"scontrol show partition: {_why_partition(chosen, partition)}")
    _max_time(draft, chosen)
    _interconnect(draft, nodes)
    _containers(draft, site)
    _options(draft, site)
    if login is not None:
        draft.set("login", msgspec.to_builtins(login), f"the login node it was asked on ({login.host})")
    _keep_valid(draft)
    return draft


# What a required field is when the cluster's value cannot be written: the safe smallest.
_REQUIRED = {"gpus_per_node": 1, "cpus_per_node": 1}


def _keep_valid(draft: Draft) -> None:
    """Drop each value the profile would refuse (an absurd count, an odd name), said as not
    determined, until the profile converts: a written profile always loads."""
    for _ in range(len(draft.values) + 1):
        try:
            msgspec.convert(draft.values, ClusterProfile, strict=True)
            return
        except msgspec.ValidationError as exc:
            key = re.search(r"at `\$\.(\w+)", str(exc))
            if key is None or key.group(1) not in draft.values or key.group(1) == "name":
                raise
            name = key.group(1)
            draft.undetermined.append(f"{name}: the cluster's {one_line(str(draft.values[name]))!r} is refused: {exc}")
            if name in _REQUIRED and draft.values[name] != _REQUIRED[name]:
                draft.set(
                    name, _REQUIRED[name], f"NOT DETERMINED: the cluster's value is refused, {_REQUIRED[name]} written"
                )
            else:
                del draft.values[name], draft.origins[name]
    raise AssertionError("unreachable: every key was dropped")


def choose_partition(partitions: tuple[Partition, ...], wanted: str | None) -> Partition:
    names = ", ".join(repr(p.name) for p in partitions)
    if not partitions:
        raise SchedulerError("scontrol show partition lists no partition: nothing to write a profile for")
    if wanted is not None:
        for partition in partitions:
            if partition.name == wanted:
                return partition
        raise UsageError(f"--partition {wanted!r}: no such partition (the cluster has {names})")
    defaults = [p for p in partitions if p.default]
    if len(defaults) == 1 or len(partitions) == 1:
        return (defaults or list(partitions))[0]
    raise UsageError(f"{len(partitions)} partitions and none is the default: choose one with --partition ({names})")


def _why_partition(partition: Partition, wanted: str | None) -> str:
    return "--partition" if wanted is not None else "Default=YES" if partition.default else "the only partition"


def _gpus(draft: Draft, site: SlurmSite, nodes: list[Node]) -> None:
    counts = [sum(g.count for g in node.gres if g.name == "gpu") for node in nodes]
    with_gpus = [count for count in counts if count]
    if not with_gpus:
        draft.set("accelerator", "cpu", f"no node of the partition has a gpu GRES ({len(nodes)} nodes)")
        draft.set("gpus_per_node", 1, "no GPUs: processes stand in for GPUs, one per node (raise it to run more)")
        draft.set("gpu_request", "none", "no GPUs to ask for")
        return
    gres = sorted({node.gres_text for node in nodes if node.gres_text})
    draft.set("accelerator", "gpu", f"scontrol show node: Gres={' / '.join(gres)}")
    types = {g.type for node in nodes for g in node.gres if g.name == "gpu"}
    known = GPU_TYPES.get(next(iter(types)).lower()) if len(types) == 1 and None not in types else None
    if known:
        model, memory_gb, vendor = known
        draft.set(
            "gpu", {"model": model, "memory_gb": memory_gb, "vendor": vendor}, f"the GRES type {next(iter(types))}"
        )
    else:
        named = sorted(t for t in types if t)
        said = f"the GRES types ({', '.join(named)}) name" if named else f"the GRES (Gres={gres[0]}) names"
        draft.undetermined.append(
            f"gpu: {said} no GPU model clusterkit knows the memory of: "
            "add gpu: {model: ..., memory_gb: ...} (the planner's memory estimate needs it)"
        )
    draft.set("gpus_per_node", min(with_gpus), _spread("gpu GRES", with_gpus, len(counts)))
    if "gres" in site.sbatch_options:
        how = "gres", "sbatch --help lists --gres; --gres=gpu:N fits typed GRES too"
    elif "gpus-per-node" in site.sbatch_options:
        how = "gpus-per-node", "sbatch --help lists --gpus-per-node, not --gres"
    else:
        how = "none", "sbatch --help lists neither --gres nor --gpus-per-node"
        draft.undetermined.append("gpu_request: this sbatch takes neither --gres nor --gpus-per-node")
    draft.set("gpu_request", *how)
    if "gpus-per-node" not in site.sbatch_options:
        draft.notes.append("sbatch has no --gpus-per-node (SLURM before 19.05): keep gpu_request: gres")


def _spread(what: str, values: list[int], nodes: int) -> str:
    """Where a per-node number came from, and whether the nodes agree."""
    if len(set(values)) == 1 and len(values) == nodes:
        return f"scontrol show node: {what} {values[0]} on each of the {nodes} nodes"
    return f"scontrol show node: {what} from {min(values)} to {max(values)} on {len(values)} of {nodes} nodes: the smallest"


def _cpus_and_memory(draft: Draft, nodes: list[Node]) -> None:
    cpus = [node.cpus for node in nodes if node.cpus]
    if cpus:
        draft.set("cpus_per_node", min(cpus), _spread("CPUs", cpus, len(nodes)))
    else:
        draft.set("cpus_per_node", 1, "NOT DETERMINED: scontrol show node gave no CPU count")
        draft.undetermined.append("cpus_per_node: no node says its CPU count (CPUTot): set it (1 is written)")
    # RealMemory=1 is SLURM's default for a node whose memory slurm.conf does not give: unknown, not 1 MB.
    memory = [node.memory_mb for node in nodes if node.memory_mb and node.memory_mb > 1]
    if memory:
        draft.set("mem_per_node", f"{min(memory)}M", _spread("RealMemory (MB, less MemSpecLimit)", memory, len(nodes)))
    else:
        draft.undetermined.append(
            "mem_per_node: no node says its memory (RealMemory unset or 1): left to SLURM's default"
        )


def _max_time(draft: Draft, partition: Partition) -> None:
    if partition.max_time is None:
        draft.notes.append(f"partition {partition.name} has no time limit (MaxTime=UNLIMITED): no max_time")
    elif re.fullmatch(SLURM_TIME_PATTERN, partition.max_time):
        draft.set("max_time", partition.max_time, "scontrol show partition: MaxTime")
    else:
        draft.undetermined.append(f"max_time: MaxTime={partition.max_time!r} is no SLURM time clusterkit reads")


def _interconnect(draft: Draft, nodes: list[Node]) -> None:
    features = sorted({feature for node in nodes for feature in node.features})
    named = {kind: [f for f in features if _names(f, pattern)] for kind, pattern in INTERCONNECT_WORDS}
    kinds = [kind for kind, found in named.items() if found]
    if len(kinds) == 1:
        draft.set("interconnect", kinds[0], f"node Features: {','.join(named[kinds[0]])}")
        return
    why = f"node Features name {' and '.join(kinds)}" if kinds else "no node feature names it"
    draft.set("interconnect", "none", f"NOT DETERMINED ({why}): none sets no network variable of clusterkit's")
    draft.undetermined.append(
        f"interconnect: {why} (Features={','.join(features) or 'none'}): left none; "
        "set infiniband, roce, efa, slingshot or ethernet (the login node's devices are not the compute nodes')"
    )


def _names(feature: str, pattern: str) -> bool:
    return any(re.fullmatch(pattern, word.lower()) for word in re.split(r"[^A-Za-z0-9]+", feature) if word)


def _containers(draft: Draft, site: SlurmSite) -> None:
    if "container-image" in site.srun_options:
        draft.notes.append("pyxis is here (srun --help lists --container-image): to run jobs in an image add")
        draft.notes.append("container: {image: nvcr.io/nvidia/pytorch:24.05-py3, runtime: pyxis}")
    # The first runtime found, in the order HPC sites prefer them, with an image of a kind it runs.
    images = {
        "apptainer": "/path/to/image.sif",
        "singularity": "/path/to/image.sif",
        "shifter": "docker:nvcr.io/nvidia/pytorch:24.05-py3",
        "podman": "nvcr.io/nvidia/pytorch:24.05-py3",
        "docker": "nvcr.io/nvidia/pytorch:24.05-py3",
        "enroot": "nvcr.io#nvidia/pytorch:24.05-py3",  # called directly: where pyxis is, it calls enroot
    }
    for tool, image in images.items():
        if tool == "enroot" and "container-image" in site.srun_options:
            continue
        if tool in site.container_tools:
            draft.notes.append(
                f"{tool} is on the PATH of {site.host} (the compute nodes may differ): for its images add"
            )
            draft.notes.append(f"container: {{image: {image}, runtime: {tool}}}")
            break


def _options(draft: Draft, site: SlurmSite) -> None:
    """The #SBATCH options clusterkit writes that this sbatch's --help does not list (the help
    leaves some out, SLURM 22.05's --open-mode and --wait-all-nodes: unlisted is not absent)."""
    request = draft.values.get("gpu_request")
    unlisted = [
        f"--{option.flag}"
        for option in HEADER
        if option.flag not in site.sbatch_options
        and (option.flag not in ("gres", "gpus-per-node") or option.flag == request)
    ]
    if unlisted:
        draft.undetermined.append(
            f"sbatch --help does not list {', '.join(unlisted)}, which clusterkit may write "
            "(a help text leaves some out: the tiny recipe's first job tells)"
        )


def one_line(text: str) -> str:
    """Text of the cluster's as one comment line: what is not printable is escaped, never a line break."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)[:300]


def profile_yaml(draft: Draft, heading: str) -> str:
    """The YAML text: each key dumped by the YAML library under a comment saying where it came from."""
    lines = [f"# {one_line(line)}" for line in heading.splitlines()]
    for line in draft.undetermined:
        lines.append(f"# not determined: {one_line(line)}")
    for key, value in draft.values.items():
        lines.append(f"# {one_line(draft.origins[key])}")
        lines.append(
            yaml.safe_dump({key: value}, sort_keys=False, width=1 << 16, default_flow_style=False).rstrip("\n")
        )
    lines.extend(f"# {one_line(note)}" for note in draft.notes)
    return "\n".join(lines) + "\n"

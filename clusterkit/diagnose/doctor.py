"""``clusterkit doctor``: is this node fit to train on, and if not, what to change.

Facts are gathered once (commands, files, environment) into :class:`HostFacts`
(:mod:`clusterkit.diagnose.host_facts`); :func:`diagnose` is a pure function of them, so captured
outputs of real GPU nodes exercise every rule where no GPU exists. Rules of thumb: 16 GB host RAM
per GPU, identical GPUs in one job.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from clusterkit.diagnose.host_facts import GPU, HostFacts, nic_affinity, parse_gpus, parse_nvlink, parse_topology
from clusterkit.spec.network import DEBUG_ENV, LEGACY_ENV

PASS, WARN, FAIL, INFO = "pass", "warn", "fail", "info"
GIB = 1024**3
RAM_PER_GPU_GIB = 16
# Shared memory one data loader worker needs for its prefetched batches (a rough, generous figure).
SHM_PER_WORKER_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    detail: str
    fix: str = ""


def _ifname_matches(spec: str, interfaces: list[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects: prefixes, ``^`` excludes, ``=`` exact names."""
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [name for name in spec.lstrip("=").split(",") if name]

    def hit(interface: str) -> bool:
        return any(interface == name if exact else interface.startswith(name) for name in names)

    return [i for i in interfaces if hit(i) != exclude and not (exclude and i == "lo")]


def diagnose(facts: HostFacts) -> list[Check]:
    checks = [_torch_check(facts)]
    gpus = parse_gpus(facts.gpu_query)
    if not gpus:
        checks.append(
            Check(
                "GPUs",
                INFO,
                "no NVIDIA GPU on this node (nvidia-smi absent or lists none): GPU checks "
                "skipped; only CPU (gloo) runs can train here",
            )
        )
    else:
        checks += _gpu_checks(facts, gpus)
    checks += _host_checks(facts, len(gpus))
    checks += _network_checks(facts)
    return checks


def _torch_check(facts: HostFacts) -> Check:
    torch = facts.torch
    if torch is None:
        return Check(
            "torch",
            FAIL,
            "torch is not importable",
            "pip install 'clusterkit[train]' (or your site's CUDA build of torch first)",
        )
    if torch["cuda"] is None:
        return Check("torch", PASS, f"torch {torch['version']}, a CPU build (gloo only)")
    nccl = f", NCCL {torch['nccl']}" if torch["nccl"] else ""
    return Check("torch", PASS, f"torch {torch['version']}, CUDA {torch['cuda']}{nccl}")


def _gpu_checks(facts: HostFacts, gpus: list[GPU]) -> list[Check]:
    checks = []
    torch = facts.torch or {}
    models = sorted({(g.name, g.memory_mib) for g in gpus})
    summary = f"{len(gpus)} x {gpus[0].name} ({gpus[0].memory_mib / 1024:.0f} GiB), driver {gpus[0].driver}"
    if torch and torch.get("cuda") is None:
        checks.append(
            Check(
                "CUDA",
                FAIL,
                f"{summary}, but torch is a CPU build",
                "install a CUDA build of torch matching the driver",
            )
        )
    elif torch and not torch.get("cuda_available"):
        checks.append(
            Check(
                "CUDA",
                FAIL,
                f"{summary}, but torch (CUDA {torch.get('cuda')}) cannot use them",
                "the driver may be older than torch's CUDA needs: update the driver or pick an older CUDA build",
            )
        )
    else:
        checks.append(Check("CUDA", PASS, summary))
    checks.append(_visibility_check(facts, gpus))
    if len(models) > 1:
        listed = ", ".join(f"{name} {memory / 1024:.0f} GiB" for name, memory in models)
        checks.append(
            Check(
                "same GPUs",
                FAIL,
                f"mixed GPUs on one node: {listed}",
                "the slowest GPU sets every step's pace: ask for one model (resources.constraint)",
            )
        )
    else:
        checks.append(Check("same GPUs", PASS, f"all {len(gpus)} are {models[0][0]} with {models[0][1]} MiB"))
    if facts.topo:
        checks += _topology_checks(facts.topo)
    if facts.nvlink:
        checks.append(_nvlink_check(facts.nvlink))
    return checks


def _visibility_check(facts: HostFacts, gpus: list[GPU]) -> Check:
    env = facts.env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    listed = [v for v in (visible or "").split(",") if v.strip()]
    slurm = env.get("SLURM_GPUS_ON_NODE") or (
        str(len(env["SLURM_JOB_GPUS"].split(","))) if env.get("SLURM_JOB_GPUS") else None
    )
    seen = (facts.torch or {}).get("device_count", len(gpus))
    if facts.in_job and slurm is not None and int(slurm) != seen:
        return Check(
            "GPU visibility",
            FAIL,
            f"SLURM allocated {slurm} GPUs on this node, torch sees {seen} (CUDA_VISIBLE_DEVICES={visible!s})",
            "do not set CUDA_VISIBLE_DEVICES in setup/env; request GPUs the site's way (profile gpu_request)",
        )
    if visible is not None and not facts.in_job and len(listed) != len(gpus):
        return Check(
            "GPU visibility",
            WARN,
            f"CUDA_VISIBLE_DEVICES={visible} shows {len(listed)} of the {len(gpus)} GPUs here",
            "unset CUDA_VISIBLE_DEVICES outside jobs; SLURM sets it inside an allocation",
        )
    where = ", as SLURM allocated" if facts.in_job and slurm is not None else ""
    return Check("GPU visibility", PASS, f"torch sees {seen} of {len(gpus)} GPUs{where}")


def _topology_checks(topo: str) -> list[Check]:
    links = parse_topology(topo)
    checks = []
    if links:
        nvlink = {pair for pair, kind in links.items() if kind.startswith("NV")}
        kinds = sorted({kind for kind in links.values()})
        if len(nvlink) == len(links):
            checks.append(Check("GPU links", PASS, f"NVLink between every GPU pair ({', '.join(kinds)})"))
        elif nvlink:
            slow = sorted({f"GPU{a}-GPU{b} {links[(a, b)]}" for a, b in links if (a, b) not in nvlink and a < b})
            checks.append(
                Check(
                    "GPU links",
                    WARN,
                    f"some GPU pairs have no NVLink: {', '.join(slow[:6])}" + (" ..." if len(slow) > 6 else ""),
                    "keep tensor-parallel groups inside NVLink-connected GPUs",
                )
            )
        else:
            crossing = " (some across CPU sockets: SYS)" if "SYS" in kinds else ""
            checks.append(
                Check(
                    "GPU links",
                    WARN,
                    f"no NVLink: GPUs talk over PCIe ({', '.join(kinds)}){crossing}",
                    "expect all-reduce far below NVLink speed (DDP ~30% slower); keep tp=1, "
                    "or TP only within PIX pairs; use gradient accumulation to communicate less often",
                )
            )
    far = sorted(gpu for gpu, kind in nic_affinity(topo).items() if kind in ("NODE", "SYS"))
    if far:
        checks.append(
            Check(
                "GPU-NIC",
                WARN,
                f"GPU {', '.join(map(str, far))} reach every NIC only across host bridges "
                f"or sockets: no GPUDirect RDMA for them",
                "ask ops about the node's PCIe layout",
            )
        )
    return checks


def _nvlink_check(text: str) -> Check:
    status = parse_nvlink(text)
    if not status:
        return Check("NVLink", INFO, "nvidia-smi nvlink --status lists no links")
    most = max(total for _, total, _ in status.values())
    degraded = {gpu: (active, total) for gpu, (active, total, _) in status.items() if active < most}
    if degraded:
        listed = ", ".join(f"GPU {gpu}: {active} of {most} links up" for gpu, (active, _) in sorted(degraded.items()))
        return Check(
            "NVLink",
            FAIL,
            listed,
            "a link is down: report the node to ops (drain it); every collective through that GPU runs slower",
        )
    speed = next((speed for _, _, speed in status.values() if speed), "")
    return Check(
        "NVLink", PASS, f"{most} links up on each of {len(status)} GPUs" + (f", {speed} each" if speed else "")
    )


def _host_checks(facts: HostFacts, gpus: int) -> list[Check]:
    """RAM and /dev/shm against the GPUs here (or one training process where there is none)."""
    checks = []
    unit = "GPU" if gpus else "process (no GPU)"
    gpus = max(gpus, 1)
    per_gpu = facts.mem_total_bytes / GIB / gpus
    if per_gpu >= RAM_PER_GPU_GIB:
        checks.append(Check("host RAM", PASS, f"{facts.mem_total_bytes / GIB:.0f} GiB, {per_gpu:.0f} GiB per {unit}"))
    else:
        checks.append(
            Check(
                "host RAM",
                WARN,
                f"{facts.mem_total_bytes / GIB:.0f} GiB = {per_gpu:.1f} GiB per GPU, "
                f"below the {RAM_PER_GPU_GIB} GiB per GPU rule of thumb",
                "fewer data loader workers, no CPU offload, or nodes with more memory",
            )
        )
    ranks = gpus
    needed = ranks * facts.dataloader_workers * SHM_PER_WORKER_BYTES
    if facts.shm_bytes is None:
        checks.append(
            Check(
                "/dev/shm",
                WARN,
                "no /dev/shm: data loader workers cannot share batches",
                "mount a tmpfs at /dev/shm, or dataloader_num_workers: 0",
            )
        )
    elif facts.shm_bytes < needed:
        checks.append(
            Check(
                "/dev/shm",
                WARN,
                f"{facts.shm_bytes / GIB:.2f} GiB for {ranks} ranks x "
                f"{facts.dataloader_workers} workers (wants ~{needed / GIB:.1f} GiB)",
                "a bigger /dev/shm (docker --shm-size, a larger tmpfs), or fewer dataloader_num_workers",
            )
        )
    else:
        checks.append(
            Check(
                "/dev/shm",
                PASS,
                f"{facts.shm_bytes / GIB:.1f} GiB for {ranks} ranks x {facts.dataloader_workers} workers",
            )
        )
    checks.append(Check("CPU cores", INFO, f"{facts.cpu_count} usable, {facts.cpu_count / gpus:.1f} per {unit}"))
    return checks


def _network_checks(facts: HostFacts) -> list[Check]:
    env, checks = facts.env, []
    if facts.rdma_devices:
        checks.append(Check("RDMA devices", INFO, ", ".join(facts.rdma_devices)))
        if env.get("NCCL_IB_DISABLE") == "1":
            checks.append(
                Check(
                    "NCCL_IB_DISABLE",
                    WARN,
                    f"NCCL_IB_DISABLE=1 while RDMA devices exist ({facts.rdma_devices[0]}...)",
                    "unset it (or network.profile: infiniband/roce) to use the fabric instead of TCP sockets",
                )
            )
    else:
        checks.append(
            Check("RDMA devices", INFO, "none (no InfiniBand, RoCE or EFA): NCCL uses TCP sockets between nodes")
        )
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec:
        chosen = _ifname_matches(spec, facts.net_interfaces)
        if chosen:
            checks.append(Check("NCCL_SOCKET_IFNAME", PASS, f"{spec} selects {', '.join(chosen)}"))
        else:
            checks.append(
                Check(
                    "NCCL_SOCKET_IFNAME",
                    FAIL,
                    f"{spec} matches no interface here ({', '.join(facts.net_interfaces) or 'none'})",
                    "name an interface that exists on every node (ip -br link), or unset it",
                )
            )
    for name, values in DEBUG_ENV.items():
        if env.get(name, "").upper() in values:
            checks.append(
                Check(
                    name,
                    WARN,
                    f"{name}={env[name]} is a debugging setting left on",
                    "unset it for production runs (network.debug: true turns such settings on for one run)",
                )
            )
    for old, new in LEGACY_ENV.items():
        if old in env and new in env:
            checks.append(
                Check(
                    old, WARN, f"{old}={env[old]} beside {new}={env[new]}: torch >= 2.2 reads {new} only", f"drop {old}"
                )
            )
        elif old in env:
            checks.append(
                Check(
                    old, WARN, f"{old} is the pre-2.2 name; newer torch ignores or deprecates it", f"rename it to {new}"
                )
            )
    return checks


def to_json(checks: list[Check]) -> list[dict]:
    return [asdict(check) for check in checks]


def print_report(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Cells are Text, never markup: a fix like ``pip install 'clusterkit[train]'`` or an env value
    # holding ``[/]`` is shown as written.
    styles = {PASS: "green", WARN: "yellow", FAIL: "bold red", INFO: "cyan"}
    table = Table("check", "verdict", "detail", "fix", show_lines=False)
    for check in checks:
        table.add_row(
            Text(check.name), Text(check.verdict, style=styles[check.verdict]), Text(check.detail), Text(check.fix)
        )
    console = Console()
    console.print(table)
    counts = {verdict: sum(c.verdict == verdict for c in checks) for verdict in (PASS, WARN, FAIL)}
    console.print(f"{counts[PASS]} pass, {counts[WARN]} warn, {counts[FAIL]} fail")

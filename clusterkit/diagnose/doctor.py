"""``clusterkit doctor``: is this node fit to train on, and if not, what to change.

Facts are gathered once (commands, files, environment) into :class:`HostFacts`; :func:`diagnose`
is a pure function of them, so captured outputs of real GPU nodes exercise every rule where no GPU
exists. Rules of thumb: 16 GB host RAM per GPU, identical GPUs in one job.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clusterkit.spec.network import DEBUG_ENV, LEGACY_ENV

PASS, WARN, FAIL, INFO = "pass", "warn", "fail", "info"
GIB = 1024**3
RAM_PER_GPU_GIB = 16
# Shared memory one data loader worker needs for its prefetched batches (a rough, generous figure).
SHM_PER_WORKER_BYTES = 256 * 1024**2


@dataclass
class HostFacts:
    """What doctor looks at. Text fields hold command output as captured (None: command absent)."""

    env: dict[str, str]
    torch: dict | None  # version, cuda, nccl, cuda_available, device_count; None: not importable
    gpu_query: str | None = None  # nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
    topo: str | None = None  # nvidia-smi topo -m
    nvlink: str | None = None  # nvidia-smi nvlink --status
    rdma_devices: list[str] = field(default_factory=list)  # /sys/class/infiniband (IB, RoCE and EFA)
    net_interfaces: list[str] = field(default_factory=list)
    mem_total_bytes: int = 0
    shm_bytes: int | None = None
    cpu_count: int = 1
    in_job: bool = False
    dataloader_workers: int = 2


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_mib: int
    driver: str


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _torch_facts() -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    cuda_available = torch.cuda.is_available()
    nccl = None
    if cuda_available:
        try:
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = None
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "cuda_available": cuda_available,
        "device_count": torch.cuda.device_count() if cuda_available else 0,
    }


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def gather(in_job: bool = False, dataloader_workers: int = 2) -> HostFacts:
    """This node's facts, read now."""
    mem_total = 0
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        mem_total = int(match.group(1)) * 1024 if match else 0
    except OSError:
        pass
    try:
        stats = os.statvfs("/dev/shm")
        shm: int | None = stats.f_blocks * stats.f_frsize
    except OSError:
        shm = None
    return HostFacts(
        env=dict(os.environ),
        torch=_torch_facts(),
        gpu_query=_run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"]
        ),
        topo=_run(["nvidia-smi", "topo", "-m"]),
        nvlink=_run(["nvidia-smi", "nvlink", "--status"]),
        rdma_devices=_listdir("/sys/class/infiniband"),
        net_interfaces=_listdir("/sys/class/net"),
        mem_total_bytes=mem_total,
        shm_bytes=shm,
        cpu_count=len(os.sched_getaffinity(0)),
        in_job=in_job,
        dataloader_workers=dataloader_workers,
    )


def parse_gpus(text: str | None) -> list[GPU]:
    gpus = []
    for line in (text or "").splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            memory = re.match(r"\d+", parts[2])
            gpus.append(GPU(int(parts[0]), parts[1], int(memory.group()) if memory else 0, parts[3]))
    return gpus


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """GPU pair → link type (NV12, PIX, PXB, PHB, NODE, SYS) from ``nvidia-smi topo -m``."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), [])
    gpu_columns = [i for i, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)]
    links = {}
    for line in lines:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]) or len(cells) <= len(gpu_columns):
            continue
        row = int(cells[0][3:])
        for column in gpu_columns:
            col = int(header[column][3:])
            if col != row:
                links[(row, col)] = cells[1 + column]
    return links


def nic_affinity(text: str) -> dict[int, str]:
    """Each GPU's closest link to any NIC (the NIC columns of ``topo -m``); empty without NICs."""
    order = ["PIX", "PXB", "PHB", "NODE", "SYS"]
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), [])
    nic_columns = [i for i, name in enumerate(header) if re.fullmatch(r"NIC\d+|mlx\d+_\d+|efa\d+|rdmap\S+", name)]
    closest = {}
    for line in lines:
        cells = line.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]) and nic_columns and len(cells) > max(nic_columns):
            kinds = [cells[1 + i] for i in nic_columns if cells[1 + i] in order]
            if kinds:
                closest[int(cells[0][3:])] = min(kinds, key=order.index)
    return closest


def parse_nvlink(text: str) -> dict[int, tuple[int, int, str]]:
    """GPU → (active links, all links, speed of an active link) from ``nvidia-smi nvlink --status``."""
    found: dict[int, tuple[int, int, str]] = {}
    gpu = None
    for line in text.splitlines():
        header = re.match(r"GPU (\d+):", line.strip())
        if header:
            gpu = int(header.group(1))
            found[gpu] = (0, 0, "")
            continue
        link = re.match(r"Link \d+: (.*)", line.strip())
        if link and gpu is not None:
            active, total, speed = found[gpu]
            state = link.group(1).strip()
            up = bool(re.match(r"[\d.]+ GB/s", state))
            found[gpu] = (active + up, total + 1, speed or (state if up else ""))
    return found


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

"""What this node is: its facts, read once (commands, files, environment), and the parsers of
``nvidia-smi`` output. :mod:`clusterkit.diagnose.doctor` judges them; keeping the reading here
lets the rules run on captured outputs of real GPU nodes where no GPU exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


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

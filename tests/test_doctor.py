"""`clusterkit doctor`: for real on this machine (CPU, no GPU), and on captured `nvidia-smi`
outputs of real GPU nodes (tests/fixtures/doctor/README.md says where each comes from) — no GPU
exists here, so those rules can only be exercised on captured text."""

from __future__ import annotations

import json
import os
from pathlib import Path

from clusterkit.diagnose.doctor import FAIL, INFO, PASS, WARN, Check, diagnose
from clusterkit.diagnose.host_facts import HostFacts, parse_nvlink, parse_topology
from conftest import REPO, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
GIB = 1024**3
CUDA_TORCH = {"version": "2.13.0", "cuda": "12.8", "nccl": "2.27.5", "cuda_available": True, "device_count": 8}


def _facts(**overrides) -> HostFacts:
    values = dict(
        env={},
        torch=CUDA_TORCH,
        gpu_query=(FIXTURES / "dgx-a100-query.csv").read_text(),
        topo=(FIXTURES / "dgx-a100-topo.txt").read_text(),
        nvlink=(FIXTURES / "dgx-a100-nvlink.txt").read_text(),
        rdma_devices=[f"mlx5_{i}" for i in range(12)],
        net_interfaces=["lo", "eth0", "ib0"],
        mem_total_bytes=1024 * GIB,
        shm_bytes=512 * GIB,
        cpu_count=128,
    )
    values.update(overrides)
    return HostFacts(**values)


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_doctor_runs_here_without_a_gpu() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL", "CUDA_VISIBLE"))}
    done = run_cli("doctor", "--json", cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["torch"]["verdict"] == PASS and "CPU build" in checks["torch"]["detail"]
    assert checks["GPUs"]["verdict"] == INFO and "no NVIDIA GPU" in checks["GPUs"]["detail"]
    assert checks["host RAM"]["verdict"] == PASS and "per process (no GPU)" in checks["host RAM"]["detail"]
    assert "CUDA" not in checks and "GPU links" not in checks

    broken = run_cli(
        "doctor",
        "--json",
        cwd=REPO,
        env={
            **env,
            "NCCL_SOCKET_IFNAME": "ib9",
            "NCCL_DEBUG": "INFO",
            "NCCL_ASYNC_ERROR_HANDLING": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        },
    )
    assert broken.returncode == 1  # a failed check fails the command
    checks = {c["name"]: c for c in json.loads(broken.stdout)}
    assert (
        checks["NCCL_SOCKET_IFNAME"]["verdict"] == FAIL
        and "matches no interface" in checks["NCCL_SOCKET_IFNAME"]["detail"]
    )
    assert checks["NCCL_DEBUG"]["verdict"] == WARN
    assert (
        checks["NCCL_ASYNC_ERROR_HANDLING"]["verdict"] == WARN
        and "beside" in checks["NCCL_ASYNC_ERROR_HANDLING"]["detail"]
    )
    table = run_cli("doctor", cwd=REPO, env=env)
    assert table.returncode == 0 and "pass" in table.stdout and "fail" in table.stdout.splitlines()[-1]


def test_nvlink_node_passes() -> None:
    checks = _by_name(diagnose(_facts()))
    assert checks["CUDA"].verdict == PASS and checks["CUDA"].detail.startswith("8 x NVIDIA A100-SXM4-40GB (40 GiB)")
    assert checks["same GPUs"].verdict == PASS
    assert checks["GPU links"].verdict == PASS and "NV12" in checks["GPU links"].detail
    assert checks["NVLink"].verdict == PASS and checks["NVLink"].detail == "12 links up on each of 8 GPUs, 25 GB/s each"
    assert "GPU-NIC" not in checks  # every GPU has a PXB NIC
    assert [c.name for c in diagnose(_facts()) if c.verdict in (WARN, FAIL)] == []


def test_topology_parsing() -> None:
    dgx = parse_topology((FIXTURES / "dgx-a100-topo.txt").read_text())
    assert len(dgx) == 56 and set(dgx.values()) == {"NV12"}
    pcie = parse_topology((FIXTURES / "pcie-8gpu-topo.txt").read_text())
    assert pcie[(0, 1)] == "PIX" and pcie[(0, 2)] == "PHB" and pcie[(0, 4)] == "SYS" and len(pcie) == 56
    links = parse_nvlink((FIXTURES / "dgx-a100-nvlink-degraded.txt").read_text())
    assert links[5][:2] == (11, 12) and links[0][:2] == (12, 12)


def test_pcie_only_node_and_degraded_nvlink() -> None:
    pcie = _by_name(diagnose(_facts(topo=(FIXTURES / "pcie-8gpu-topo.txt").read_text(), nvlink=None)))
    assert (
        pcie["GPU links"].verdict == WARN
        and "no NVLink" in pcie["GPU links"].detail
        and "SYS" in pcie["GPU links"].detail
    )
    assert "keep tp=1" in pcie["GPU links"].fix
    assert pcie["GPU-NIC"].verdict == WARN and pcie["GPU-NIC"].detail.startswith("GPU 4, 5, 6, 7 ")
    degraded = _by_name(diagnose(_facts(nvlink=(FIXTURES / "dgx-a100-nvlink-degraded.txt").read_text())))
    assert degraded["NVLink"].verdict == FAIL and degraded["NVLink"].detail == "GPU 5: 11 of 12 links up"


def test_allocation_mixed_gpus_memory_and_network_rules() -> None:
    job = _by_name(
        diagnose(
            _facts(
                in_job=True,
                env={"SLURM_GPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                torch={**CUDA_TORCH, "device_count": 4},
            )
        )
    )
    assert (
        job["GPU visibility"].verdict == FAIL
        and "SLURM allocated 8 GPUs on this node, torch sees 4" in job["GPU visibility"].detail
    )
    laptop = _by_name(diagnose(_facts(env={"CUDA_VISIBLE_DEVICES": "0"})))
    assert laptop["GPU visibility"].verdict == WARN
    mixed = _by_name(diagnose(_facts(gpu_query=(FIXTURES / "mixed-query.csv").read_text())))
    assert mixed["same GPUs"].verdict == FAIL and "A100-SXM4-80GB 80 GiB" in mixed["same GPUs"].detail
    cpu_torch = _by_name(diagnose(_facts(torch={**CUDA_TORCH, "cuda": None, "cuda_available": False})))
    assert cpu_torch["CUDA"].verdict == FAIL and "CPU build" in cpu_torch["CUDA"].detail
    small = _by_name(diagnose(_facts(mem_total_bytes=64 * GIB, shm_bytes=64 * 1024**2)))
    assert small["host RAM"].verdict == WARN and "8.0 GiB per GPU" in small["host RAM"].detail
    assert small["/dev/shm"].verdict == WARN
    network = _by_name(
        diagnose(_facts(env={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_BLOCKING_WAIT": "1"}))
    )
    assert network["NCCL_IB_DISABLE"].verdict == WARN
    assert (
        network["NCCL_SOCKET_IFNAME"].verdict == PASS
        and network["NCCL_SOCKET_IFNAME"].detail == "^docker,lo selects eth0, ib0"
    )
    assert (
        network["NCCL_BLOCKING_WAIT"].verdict == WARN
        and "TORCH_NCCL_BLOCKING_WAIT" in network["NCCL_BLOCKING_WAIT"].fix
    )
    exact = _by_name(diagnose(_facts(env={"NCCL_SOCKET_IFNAME": "=eth"})))
    assert exact["NCCL_SOCKET_IFNAME"].verdict == FAIL  # '=' asks for the exact name; there is only eth0

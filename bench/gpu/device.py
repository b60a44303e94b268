"""``python -m bench.gpu.device``: this machine's accelerator as JSON on stdout, in a process of its
own (the orchestrator never holds a CUDA context that would skew the runs' memory): name, memory,
versions, the datasheet bf16 peak, and a measured bf16 matrix product as the reachable ceiling."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from typing import Any

import torch

from bench.gpu.sizes import bf16_peak

REHEARSAL_MEMORY_BYTES = 16 * 2**30  # what the rehearsal's profile claims, so the planner has a GPU to plan for


def measured_matmul_tflops(n: int = 8192, warmup: int = 3, repeats: int = 10) -> float:
    """Median bf16 n x n x n product rate on random data (never zeros: they run faster), timed with events."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def facts() -> dict[str, Any]:
    import transformers

    base: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        # the runner's default attention: FlashAttention-2 where this is installed, else SDPA
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
    }
    try:
        import deepspeed  # carried as a wheel on the device machine; the offload layout needs it

        base["deepspeed"] = deepspeed.__version__
    except ImportError:
        base["deepspeed"] = None
    if not torch.cuda.is_available():
        return {
            **base,
            "name": "CPU rehearsal",
            "memory_bytes": REHEARSAL_MEMORY_BYTES,
            "peak_tflops": None,
            "peak_source": "no GPU: MFU not computed",
        }
    props = torch.cuda.get_device_properties(0)
    peak, source = bf16_peak(props.name)
    return {
        **base,
        "name": props.name,
        "memory_bytes": props.total_memory,
        "capability": list(torch.cuda.get_device_capability(0)),
        "multiprocessors": props.multi_processor_count,
        "driver": driver(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "peak_tflops": peak,
        "peak_source": source,
        "matmul_bf16_tflops": measured_matmul_tflops(),
    }


if __name__ == "__main__":
    print(json.dumps(facts()))

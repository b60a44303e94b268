"""Preflight: before training, in the same allocation, every rank joins one all-reduce benchmark.

``python -m clusterkit.runtime.preflight RUN_DIR/job.json`` runs on every rank (the supervisor launches it
like the training entry point). Bandwidths follow nccl-tests: algbw = bytes / time, and for
all-reduce busbw = algbw * 2(n-1)/n, which is comparable across rank counts. Each node then
all-reduces within itself at the largest size; a node whose bus bandwidth is below
``preflight.slow_fraction`` of the median node's is named slow, and ``on_slow: fail`` stops the job
before it trains on that node (``exclude`` too, and the job's retry then leaves the slow nodes out). Results go to ``RUN_DIR/preflight.json`` and the job log.

The module imports torch only in :func:`run`; the rest is plain arithmetic the CLI reuses.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from clusterkit.runs.preflight_report import format_report
from clusterkit.spec.layout import JOB_JSON, PREFLIGHT_RESULT
from clusterkit.spec.resolved import decode_job_file

GPU_SIZES = (1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30)
CPU_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
EXIT_SLOW = 3
# Test hook: "RANK:SECONDS" makes that rank sleep before every timed all-reduce, standing in for a
# slow GPU or link (there is no way to slow one down for real on this machine).
SLOW_RANK_ENV = "CLUSTERKIT_PREFLIGHT_SLOW_RANK"


def bus_bandwidth(algbw: float, ranks: int) -> float | None:
    """nccl-tests' all-reduce bus bandwidth: what each link carried, independent of the rank count;
    none for one rank, which sends nothing over any link (2(n-1)/n = 0)."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 1 else None


def slow_nodes(per_node: list[dict[str, Any]], fraction: float) -> list[int]:
    """Nodes whose busbw is below ``fraction`` of the median node's."""
    measured = [node["busbw_gbps"] for node in per_node if node.get("busbw_gbps") is not None]
    if len(measured) < 2:
        return []
    median = statistics.median(measured)
    return [
        node["node"]
        for node in per_node
        if node.get("busbw_gbps") is not None and node["busbw_gbps"] < fraction * median
    ]


def run(job_file: Path) -> int:
    import torch
    import torch.distributed as dist

    job = decode_job_file(job_file.read_bytes())
    settings = job.recipe.preflight
    on_gpu = job.profile.accelerator == "gpu"
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(job.recipe.ranks_per_node)))
    node = rank // per_node
    nodes = world // per_node
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    slow_rank, _, delay = os.environ.get(SLOW_RANK_ENV, "").partition(":")
    delay_s = float(delay) if slow_rank.isdigit() and int(slow_rank) == rank else 0.0
    warmup, iterations = (5, 20) if on_gpu else (2, 5)

    def timed(size: int, group: Any = None) -> float:
        """Seconds per all-reduce of ``size`` bytes, for the slowest rank of the group."""
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor, group=group)
        dist.barrier(group=group)
        if on_gpu:
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(iterations):
            if delay_s:
                time.sleep(delay_s)
            dist.all_reduce(tensor, group=group)
        if on_gpu:
            torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - started) / iterations], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        return float(elapsed.item())

    sizes = []
    for size in GPU_SIZES if on_gpu else CPU_SIZES:
        seconds = timed(size)
        algbw = size / seconds / 1e9
        sizes.append({"bytes": size, "time_s": seconds, "algbw_gbps": algbw, "busbw_gbps": bus_bandwidth(algbw, world)})
    # Every rank creates every node's group (new_group is collective); each uses its own.
    groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
    node_busbw = None
    if per_node > 1:
        largest = sizes[-1]["bytes"]
        node_busbw = bus_bandwidth(largest / timed(largest, groups[node]) / 1e9, per_node)
    mine = {"node": node, "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "busbw_gbps": node_busbw}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    per_node_results = gathered[::per_node]  # each node's ranks report the same numbers
    slow = slow_nodes(per_node_results, settings.slow_fraction)
    result = {
        "world_size": world,
        "nodes": nodes,
        "ranks_per_node": per_node,
        "backend": dist.get_backend(),
        "sizes": sizes,
        "per_node": per_node_results,
        "slow_nodes": slow,
        "slow_fraction": settings.slow_fraction,
        "on_slow": settings.on_slow,
    }
    if rank == 0:
        target = job_file.parent / PREFLIGHT_RESULT
        staging = target.with_suffix(".tmp")
        staging.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        os.replace(staging, target)
        print(format_report(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return EXIT_SLOW if slow and settings.on_slow in ("fail", "exclude") else 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m clusterkit.runtime.preflight")
    parser.add_argument("job_file", type=Path, help=f"the {JOB_JSON} of the run directory")
    # The DeepSpeed launcher puts --local_rank before the script's own arguments; LOCAL_RANK says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    from clusterkit.runtime.rank_exit import finish

    finish(run(parser.parse_args().job_file))

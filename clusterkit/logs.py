"""A run's logs: each node's launcher output, or one rank's own output."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from clusterkit.jobstate import job_status
from clusterkit.runs import RunRecord


def log_files(record: RunRecord, rank: int | None) -> list[Path]:
    run_dir = record.path
    if rank is None:
        return sorted(run_dir.glob(f"{record.job_id}_*_log.out")) + sorted(run_dir.glob(f"{record.job_id}_*_log.err"))
    node, local = divmod(rank, record.ranks_per_node)
    node_dir = run_dir / "ranks" / f"node{node}"
    # torchrun --log-dir: <dir>/<run id>/attempt_<k>/<local rank>/{stdout,stderr}.log (newest attempt last)
    torchrun = sorted(node_dir.glob(f"*/attempt_*/{local}/std*.log"), key=lambda p: p.stat().st_mtime)
    # DeepSpeed --enable_each_rank_log: <dir>/<timestamp>_rank<global rank>.log
    deepspeed = sorted(node_dir.glob(f"*_rank{rank}.log"))
    return torchrun or deepspeed


def stream(record: RunRecord, rank: int | None, follow: bool, poll_s: float = 1.0) -> int:
    offsets: dict[Path, int] = {}
    while True:
        for path in log_files(record, rank):
            with path.open("rb") as handle:
                handle.seek(offsets.get(path, 0))
                chunk = handle.read()
            if chunk:
                if path not in offsets:
                    print(f"==> {path.relative_to(record.path)} <==", flush=True)
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
            offsets[path] = offsets.get(path, 0) + len(chunk)
        if not follow or job_status(record).done:
            return 0
        time.sleep(poll_s)

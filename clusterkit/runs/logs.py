"""A run's logs: each node's launcher output, or one rank's own output."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, BinaryIO, Protocol

from clusterkit.runs.record import RunRecord
from clusterkit.spec.bounded_read import MiB, read_bounded
from clusterkit.spec.function_jobs import RECORD_LAUNCHER
from clusterkit.spec.launchers import LAUNCHERS
from clusterkit.spec.layout import (
    STREAMS,
    deepspeed_rank_log,
    mpirun_output,
    mpirun_rank_logs,
    node_dir,
    node_log,
    torchrun_rank_logs,
)

# A run's metrics.jsonl read whole (plot, a sweep's results, Run.metrics): far more than a run logs.
METRICS_LIMIT = 256 * MiB


class Readable(Protocol):
    def open(self, mode: str = "rb") -> IO[bytes]: ...


def read_run_file(file: Readable, limit: int, what: str) -> bytes:
    """A run's file, whole: on this machine a regular file of at most ``limit`` bytes (else
    :class:`~clusterkit.spec.bounded_read.InputFileError`), on a login node as its adapter reads it."""
    if isinstance(file, Path):
        return read_bounded(file, limit, what)
    with file.open("rb") as handle:
        return handle.read()


def log_files(record: RunRecord, rank: int | None) -> list[Path]:
    run_dir = record.path
    if record.launcher == RECORD_LAUNCHER:  # a function's job: submitit's <job id>_<task>_log.{out,err}
        tasks = "*" if rank is None else rank
        streams = ("out", "err")
        return [path for stream in streams for path in sorted(run_dir.glob(f"{record.job_id}_{tasks}_log.{stream}"))]
    if rank is None:
        return [path for stream in STREAMS for path in sorted(run_dir.glob(node_log(record.job_id, "*", stream)))]
    launcher = LAUNCHERS.get(record.launcher)
    if launcher is not None and launcher.ranks == "task":  # a task per rank: srun's per-task log is the rank's own
        return [path for stream in STREAMS if (path := run_dir / node_log(record.job_id, rank, stream)).exists()]
    if record.launcher == "mpirun":  # --output-filename: <dir>/<job family>/rank.<R>/{stdout,stderr}
        return sorted((run_dir / mpirun_output(record.job_id)).glob(mpirun_rank_logs(rank)))
    node, local = divmod(rank, record.ranks_per_node)
    rank_logs = run_dir / node_dir(node)
    # torchrun --log-dir: <dir>/<run id>/attempt_<k>/<local rank>/{stdout,stderr}.log (newest attempt last)
    torchrun = sorted(rank_logs.glob(torchrun_rank_logs(local)), key=lambda p: p.stat().st_mtime)
    # DeepSpeed --enable_each_rank_log: <dir>/<timestamp>_rank<global rank>.log
    deepspeed = sorted(rank_logs.glob(deepspeed_rank_log(rank)))
    return torchrun or deepspeed


def stream_run(
    record: RunRecord, rank: int | None, follow: bool, done: Callable[[], bool], out: BinaryIO | None = None
) -> int:
    """A run directory on this machine: its logs, until ``done()`` with ``follow``."""
    return stream(lambda: log_files(record, rank), done, follow, base=record.run_dir, out=out)


def stream(
    files: Callable[[], Sequence[Readable]],
    done: Callable[[], bool],
    follow: bool,
    base: str,
    poll_s: float = 1.0,
    out: BinaryIO | None = None,
) -> int:
    """Write what the files hold beyond what was written, each under a header naming it (relative
    to ``base``), to ``out`` (default stdout); with ``follow``, until ``done()``."""
    out = out or sys.stdout.buffer
    offsets: dict[str, int] = {}
    while True:
        for path in files():
            key = str(path)
            with path.open("rb") as handle:
                handle.seek(offsets.get(key, 0))
                chunk = handle.read()
            if chunk:
                if key not in offsets:
                    out.write(f"==> {key.removeprefix(base.rstrip('/') + '/')} <==\n".encode())
                out.write(chunk)
                out.flush()
            offsets[key] = offsets.get(key, 0) + len(chunk)
        if not follow or done():
            return 0
        time.sleep(poll_s)

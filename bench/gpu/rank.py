"""``torchrun ... -m bench.gpu.rank RUN_DIR/job.json RESULT.json``: the built-in runner's own rank
(clusterkit.runtime.train.main, as ``python -m clusterkit.runtime.runner`` runs it), then this rank's
peak GPU memory written to RESULT.json. With BENCH_PROFILE_STEP=N, optimizer step N+1 runs under
torch.profiler and the result holds its kernel summary (the "why" when MFU falls short); the runner
is otherwise untouched."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from clusterkit.runtime import train
from clusterkit.runtime.rank_exit import finish, write_durably

PROFILE_ENV = "BENCH_PROFILE_STEP"
TOP_KERNELS = 25


def _kind(name: str) -> str:
    lowered = name.lower()
    if any(key in lowered for key in ("gemm", "xmma", "cutlass", "nvjet", "matmul", "wgmma")):
        return "matmul"
    if any(key in lowered for key in ("flash", "fmha", "attention", "sdpa", "softmax")):
        return "attention"
    if any(key in lowered for key in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if any(key in lowered for key in ("nccl", "memcpy", "memset")):
        return "copies/comm"
    return "elementwise/other"


def summarize(profiler: Any, wall_s: float, on_gpu: bool) -> dict[str, Any]:
    """Device time by kernel kind and the top kernels of one profiled optimizer step; busy < ~90%
    of the wall time means the GPU waits for the host (launches, Python, data). On CPU (the
    rehearsal) the same summary of CPU operators, so the code path runs."""
    wanted = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
    events = [event for event in profiler.key_averages() if event.device_type == wanted]
    field = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    device_us = [(event.key, float(getattr(event, field, 0.0)), event.count) for event in events]
    busy_us = sum(us for _, us, _ in device_us)
    by_kind: dict[str, float] = {}
    for key, us, _ in device_us:
        by_kind[_kind(key)] = by_kind.get(_kind(key), 0.0) + us / 1e6
    top = sorted(device_us, key=lambda item: -item[1])[:TOP_KERNELS]
    return {
        "wall_s": wall_s,
        "device_busy_s": busy_us / 1e6,
        "busy_fraction": busy_us / 1e6 / wall_s if wall_s else None,
        "by_kind_s": dict(sorted(by_kind.items(), key=lambda item: -item[1])),
        "top_kernels": [{"name": key[:160], "seconds": us / 1e6, "calls": count} for key, us, count in top],
    }


def profiled_trainer(base: type, step: int, sink: dict[str, Any]) -> type:
    """The runner's Trainer class, profiling optimizer step ``step + 1`` from its first micro-batch to
    the first micro-batch of the next (so its optimizer step is inside)."""

    on_gpu = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    class ProfiledTrainer(base):  # type: ignore[misc, valid-type]
        _profiler: Any = None
        _started = 0.0

        def training_step(self, model, inputs, *args, **kwargs):
            done = self.state.global_step
            if done == step and self._profiler is None and "summary" not in sink:
                synchronize()
                self._profiler = torch.profiler.profile(activities=activities)
                self._profiler.start()
                self._started = time.perf_counter()
            elif done == step + 1 and self._profiler is not None:
                synchronize()
                wall = time.perf_counter() - self._started
                self._profiler.stop()
                try:
                    sink["summary"] = summarize(self._profiler, wall, on_gpu)
                except Exception as exc:  # a profiler API that moved costs the summary, not the row
                    sink["summary"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                self._profiler = None
            return super().training_step(model, inputs, *args, **kwargs)

    return ProfiledTrainer


def memory_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info()
        facts.update(
            peak_allocated=torch.cuda.max_memory_allocated(),
            peak_reserved=torch.cuda.max_memory_reserved(),
            device_used_at_end=total - free,
            device_total=total,
        )
    return facts


def main(job_file: Path, result_file: Path) -> int:
    sink: dict[str, Any] = {}
    step = os.environ.get(PROFILE_ENV)
    if step:
        train.FingerprintingTrainer = profiled_trainer(train.FingerprintingTrainer, int(step), sink)
    result: dict[str, Any] = {"pid": os.getpid()}
    started = time.monotonic()
    try:
        result["exit"] = train.main(job_file)
    except BaseException as exc:  # an OOM is a result: its peak and message are kept
        result.update(
            exit=1,
            error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:400] if str(exc) else ''}",
            traceback=traceback.format_exc()[-3000:],
        )
        raise
    finally:
        result.update(seconds=time.monotonic() - started, **memory_facts())
        if "summary" in sink:
            result["profile"] = sink["summary"]
        write_durably(result_file, json.dumps(result, indent=2) + "\n")
    return result["exit"]


if __name__ == "__main__":
    finish(main(Path(sys.argv[1]), Path(sys.argv[2])))

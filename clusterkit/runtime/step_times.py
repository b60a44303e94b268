"""Each rank's own step times, for finding stragglers (clusterkit.supervisor.stragglers): one JSON
line per optimizer step in ``ranks/steps/rank<R>.jsonl``, ``{"step", "step_s", "data_s", "time"}``,
plus ``gpu_util`` (percent) and ``gpu_mem_bytes`` where NVML answers for the rank's GPU (absent
elsewhere: no GPU, no pynvml, an NVML error; never a zero that would read as an idle GPU).

``data_s`` is the time spent in ``next()`` on the Trainer's epoch iterator, measured by wrapping
that iterator in ``get_batch_samples`` (the collator runs inside it with in-process loading, a
worker's queue is waited on inside it otherwise). Not the whole of ``get_batch_samples``: after
fetching it exchanges the token count with every rank (a collective), where the fast ranks wait
for the slow one, and that wait is no rank's own time. Not callbacks alone: ``on_step_begin``
comes after the fetch, so the gap between steps would mix the fetch with that exchange, logging
and saving. ``step_s`` runs from ``on_step_begin`` to ``on_step_end`` (forward, backward with the
gradient sync, optimizer step).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from transformers import TrainerCallback


class GpuSampler:
    """Utilisation and memory of one GPU through NVML (nvidia-ml-py's ``pynvml``, imported here and
    only here: an optional dependency)."""

    def __init__(self, nvml: Any, handle: Any):
        self.nvml, self.handle = nvml, handle

    @classmethod
    def open(cls, device_index: int) -> GpuSampler | None:
        """The sampler for CUDA device ``device_index`` of this process, or None where NVML is not
        there to ask. NVML numbers the machine's GPUs, CUDA those CUDA_VISIBLE_DEVICES leaves."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            chosen = visible[device_index] if device_index < len(visible) else str(device_index)
            handle = (
                pynvml.nvmlDeviceGetHandleByIndex(int(chosen))
                if chosen.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(chosen)
            )
        except Exception:  # NVMLError and its many subclasses; a driver without NVML
            return None
        return cls(pynvml, handle)

    def sample(self) -> dict[str, int]:
        try:
            return {
                "gpu_util": int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu),
                "gpu_mem_bytes": int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used),
            }
        except Exception:  # a GPU that fell off the bus answers nothing: the fields stay absent
            return {}


class _TimedIterator:
    """An iterator that adds the time each ``next()`` takes to its recorder's ``data_s``."""

    def __init__(self, inner: Iterator[Any], recorder: StepTimes):
        self.inner, self.recorder = inner, recorder

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.recorder.data_s += time.perf_counter() - start


class StepTimes(TrainerCallback):
    """Appends the rank's line at each step end; ``timed`` wraps the Trainer's epoch iterator (see
    the module's doc). The file stays open and each line is flushed, not synced: a diagnosis that
    status reads while the job runs, cheap enough for every step."""

    def __init__(self, path: Path, gpu: GpuSampler | None = None, gpu_every: int = 1):
        self.path, self.gpu, self.gpu_every = path, gpu, max(1, gpu_every)
        self.data_s = 0.0
        self._begin: float | None = None
        self._out: TextIO | None = None

    def timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        return _TimedIterator(iterator, self)

    def on_step_begin(self, args, state, control, **kwargs):
        self._begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._begin is None:
            return
        record: dict[str, Any] = {
            "step": state.global_step,
            "step_s": round(time.perf_counter() - self._begin, 6),
            "data_s": round(self.data_s, 6),
            "time": round(time.time(), 3),
        }
        if self.gpu is not None and state.global_step % self.gpu_every == 0:
            record.update(self.gpu.sample())
        self.data_s, self._begin = 0.0, None
        if self._out is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self.path.open("a", encoding="utf-8")
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self._out is not None:
            self._out.close()
            self._out = None

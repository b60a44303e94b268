"""What every part of the GPU proof shares: where things are, the sizes, the device, the clock, and
the results written to $OUT after every step (what is under $OUT comes back even after a timeout)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu.sizes import Sizes


@dataclass
class Results:
    out: Path
    render_markdown: Callable[[dict[str, Any]], str] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def part(self, name: str) -> dict[str, Any]:
        return self.data.setdefault("parts", {}).setdefault(name, {})

    def fail(self, where: str, why: str) -> None:
        self.data.setdefault("failures", []).append(f"{where}: {why}")

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.started, 1)
        _replace(self.out / "results.json", json.dumps(self.data, indent=2, default=str) + "\n")
        if self.render_markdown is not None:
            _replace(self.out / "results.md", self.render_markdown(self.data))


def _replace(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


@dataclass
class Context:
    repo: Path
    work: Path  # run directories, recipes, the profile: /dev/shm where it is large enough
    sizes: Sizes
    device: dict[str, Any]
    profile: Path
    results: Results

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    def save(self) -> None:
        self.results.save()

    def mfu(self, tokens_per_s: float | None) -> float | None:
        """6·N·tokens/s over the GPU's dense bf16 peak (N: the planner's exact parameter count)."""
        peak, params = self.device.get("peak_tflops"), self.results.data.get("model_params")
        if not tokens_per_s or not peak or not params:
            return None
        return 6 * params * tokens_per_s / (peak * 1e12)

    @staticmethod
    def metrics(run_dir: Path) -> list[dict[str, Any]]:
        from clusterkit.runs.record import metric_records
        from clusterkit.spec.layout import METRICS

        try:
            return metric_records((run_dir / METRICS).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return []

"""Training curves: loss, learning rate and samples/s against step, read from a run's metrics.jsonl
(``clusterkit plot`` draws them; :mod:`clusterkit.runs.charts` holds the drawing).

A value is plotted only when it is a finite number at a whole-number step: the runner writes null
for a learning rate or speed it does not know (the first log step's samples/s), a script may write
anything, and a line cut short by a killed rank is no record at all. A number beyond ±1e300 (a
diverged loss) is left out and counted: a chart's range, its margins and ticks, would overflow. A resumed run logs again the
steps after its checkpoint: each step keeps its newest value, so a curve never runs backwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The metrics.jsonl keys plotted, in panel order, with their axis labels.
QUANTITIES = {"loss": "loss", "learning_rate": "learning rate", "samples_per_s": "samples/s"}
DRAWABLE = 1e300  # the largest magnitude drawn: twice it, and its square, are still finite


@dataclass(frozen=True)
class Series:
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class Curves:
    """One run's curves, with the label its lines carry on the chart."""

    job_id: str
    label: str
    run_dir: str
    point: dict[str, Any] = field(default_factory=dict)  # a sweep point's values ({} for a plain run)
    series: dict[str, Series] = field(default_factory=dict)  # quantity -> its values (only those logged)
    too_large: dict[str, int] = field(default_factory=dict)  # quantity -> how many values beyond DRAWABLE were left out

    @property
    def empty(self) -> bool:
        return not self.series


def finite_number(value: Any) -> float | None:
    """A metric's value when it is a finite number; anything else (null, NaN, a string, a bool) None."""
    # bool is an int to Python, but true is no loss.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def series_of(records: list[dict[str, Any]], quantity: str) -> tuple[Series | None, int]:
    """The quantity's values by step (none logged: None), and how many were too large to draw."""
    by_step: dict[int, float] = {}
    too_large = set()
    for record in records:
        step, value = record.get("step"), finite_number(record.get(quantity))
        if value is not None and isinstance(step, int) and not isinstance(step, bool):
            if abs(value) <= DRAWABLE:
                by_step[step] = value
                too_large.discard(step)
            else:  # a later log of the step (a resumed run) replaces it, as it replaces any value
                by_step.pop(step, None)
                too_large.add(step)
    steps = sorted(by_step)
    return (Series(steps, [by_step[step] for step in steps]) if steps else None), len(too_large)


def point_label(point: Mapping[str, Any]) -> str:
    """A sweep point in few words: each key's last part (``learning_rate=0.001``), or the whole key
    path where two keys would read the same."""
    short = [key.rsplit(".", 1)[-1] for key in point]
    names = short if len(set(short)) == len(short) else list(point)
    return " ".join(f"{name}={value}" for name, value in zip(names, point.values()))


def curves_of(
    job_id: str, run_dir: str, records: list[dict[str, Any]], point: Mapping[str, Any] | None = None
) -> Curves:
    """A run's curves from its metrics records; the label starts with the job id (a sweep task's is
    the TASK column of ``clusterkit status <array id>``), then the point's values."""
    label = " ".join(filter(None, (job_id, point_label(point or {}))))
    found = {quantity: series_of(records, quantity) for quantity in QUANTITIES}
    return Curves(
        job_id,
        label,
        run_dir,
        dict(point or {}),
        {q: s for q, (s, _) in found.items() if s is not None},
        {q: count for q, (_, count) in found.items() if count},
    )


def too_large_note(curves: Curves) -> str | None:
    """``job 41: 2 loss values and 1 learning rate value beyond ±1e+300 left out (too large to draw)``."""
    if not curves.too_large:
        return None
    counted = [f"{count} {QUANTITIES[q]} value{'s' if count > 1 else ''}" for q, count in curves.too_large.items()]
    return f"job {curves.job_id}: {' and '.join(counted)} beyond ±{DRAWABLE:g} left out (too large to draw)"


def curves_json(curves: list[Curves], outputs: list[str]) -> dict[str, Any]:
    """``clusterkit plot --json`` (docs/json.md): every plotted value, and the files written."""
    return {
        "runs": [
            {
                "job_id": c.job_id,
                "label": c.label,
                "run_dir": c.run_dir,
                "point": c.point,
                "series": {q: {"steps": s.steps, "values": s.values} for q, s in c.series.items()},
            }
            for c in curves
        ],
        "outputs": outputs,
    }

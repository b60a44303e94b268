"""A sweep loaded: the recipe's ``sweep:`` grid (and ``--grid`` from the command line) expanded into
its points, each one a recipe loaded and validated on its own with the point's values as overrides.
Every point is checked before anything is written or queued; one bad point stops the sweep."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from clusterkit.errors import Finding, RecipeError, RecipeErrors, UsageError
from clusterkit.load.loader import LoadedRecipe, Override, load_recipe, parse_override
from clusterkit.spec.arrays import MAX_TASKS, array_spec
from clusterkit.spec.recipe import KEY_PATH_PATTERN
from clusterkit.spec.resolved import ArrayPlacement


@dataclasses.dataclass(frozen=True)
class SweepPoints:
    base: LoadedRecipe  # the recipe as given (its sweep: block included)
    points: list[LoadedRecipe]  # point i: run by array task i; its recipe.array says so
    grid: dict[str, list[Any]]

    @property
    def spec(self) -> str:
        return self.points[0].recipe.array.spec  # type: ignore[union-attr]


def parse_grid(texts: Sequence[str]) -> dict[str, list[Any]]:
    """``--grid key.path=v1,v2`` → {key.path: [v1, v2]}; each value is read as YAML, as --set reads
    one (so ``1e-3`` is a number and ``'a,b'`` cannot be given here: use a sweep: block)."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(KEY_PATH_PATTERN, key) or not raw.strip():
            raise UsageError(
                f"--grid {text!r}: expected key.path=value1,value2,..., e.g. task.trainer.args.learning_rate=1e-3,3e-4"
            )
        values = [parse_override(f"{key}={part}")[1] for part in raw.split(",")]
        if not all(isinstance(value, (str, int, float, bool)) for value in values):
            raise UsageError(f"--grid {text!r}: each value must be a string, number or boolean")
        if key in grid:
            raise UsageError(f"--grid {key}: given twice; list every value in one --grid")
        grid[key] = values
    return grid


def _point_findings(error: RecipeError, index: int, values: dict[str, Any]) -> list[Finding]:
    said = ", ".join(f"{key}={json.dumps(value)}" for key, value in values.items())
    findings = error.findings if isinstance(error, RecipeErrors) else [error.finding]
    return [dataclasses.replace(f, message=f"{f.message} (sweep point {index}: {said})") for f in findings]


def load_sweep(
    base: LoadedRecipe, grid_texts: Sequence[str] = (), max_parallel: int | None = None
) -> SweepPoints | None:
    """The points of ``base`` (a recipe loaded with its overrides), or None when it sweeps nothing
    (no sweep: block and no --grid)."""
    sweep = base.recipe.sweep
    grid = {**(dict(sweep.grid) if sweep else {}), **parse_grid(grid_texts)}
    if not grid:
        if max_parallel is not None:
            raise UsageError("--max-parallel throttles a sweep: give --grid key=v1,v2 (or a sweep: block)")
        return None
    # Counted from the value lists before any point is built: 7 keys of 10 values are 10^7 points.
    count = math.prod(len(values) for values in grid.values())
    if count > MAX_TASKS:
        raise UsageError(f"{base.path}: the grid has {count:,} points; one sweep runs at most {MAX_TASKS:,}")
    spec = array_spec(count, max_parallel or (sweep.max_parallel if sweep else None))
    points, findings = [], []
    for index, combo in enumerate(itertools.product(*grid.values())):
        values = dict(zip(grid, combo))
        point_overrides = [
            Override(tuple(int(p) if p.isdigit() else p for p in key.split(".")), value)
            for key, value in values.items()
        ]
        try:
            loaded = load_recipe(base.path, [*base.overrides, Override(("sweep",), None), *point_overrides])
        except RecipeError as exc:
            findings += [f for f in _point_findings(exc, index, values) if str(f) not in map(str, findings)]
            continue
        placement = ArrayPlacement(spec=spec, point=index, values=values)
        points.append(dataclasses.replace(loaded, recipe=msgspec.structs.replace(loaded.recipe, array=placement)))
    if findings:
        raise RecipeErrors(findings) if len(findings) > 1 else RecipeError(findings[0])
    return SweepPoints(base, points, grid)

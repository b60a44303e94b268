"""Python functions as jobs, through submitit (``pip install 'clusterkit[functions]'``):

    import clusterkit

    run = clusterkit.submit_function(lambda x: x * 2, 21, recipe="recipes/function-cpu.yaml")
    run.result()                                    # 42, once the job has ended
    runs = clusterkit.map_function(pow, [(2, 1), (2, 2)], recipe="recipes/function-cpu.yaml")
    [r.result() for r in runs]                      # [2, 4]: one job array, in the calls' order

The recipe gives the job's resources, setup and srun options (no task: the function is the task);
each run is a run directory like any other (``clusterkit status``/``ls``/``logs``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from os import PathLike
from typing import Any

from clusterkit.api import Run, overrides_of
from clusterkit.errors import UsageError

_OPTIONS = ("executor", "overrides")


def submit_function(fn: Callable[..., Any], *args: Any, recipe: str | PathLike[str], **kwargs: Any) -> Run:
    """``fn(*args, **kwargs)`` as a job of ``recipe``; ``executor=`` (slurm or local; default: slurm
    where sbatch is here) and ``overrides=`` (as :func:`~clusterkit.api.load_recipe`'s) are
    clusterkit's keywords, the others the function's."""
    options = {name: kwargs.pop(name) for name in _OPTIONS if name in kwargs}
    return _submit(fn, [(args, kwargs)], recipe, **options)[0]


def map_function(
    fn: Callable[..., Any],
    calls: Iterable[Sequence[Any]],
    *,
    recipe: str | PathLike[str],
    executor: str | None = None,
    overrides: Any = None,
) -> list[Run]:
    """``fn(*call)`` for each call (its positional arguments) as one job array (on SLURM); a run
    per call, in the calls' order."""
    calls = list(calls)
    if any(isinstance(call, (str, bytes)) or not isinstance(call, Sequence) for call in calls):
        raise UsageError("map_function: give each call as a tuple of its positional arguments")
    return _submit(fn, [(tuple(call), {}) for call in calls], recipe, executor, overrides)


def _submit(fn, calls, recipe, executor: str | None = None, overrides: Any = None) -> list[Run]:
    from clusterkit.launch.functions import load_function_recipe, submit_calls

    loaded = load_function_recipe(recipe, overrides_of(overrides))
    return [Run(record) for record in submit_calls(loaded, fn, calls, executor)]


__all__ = ["map_function", "submit_function"]

"""clusterkit: from a YAML recipe to a running multi-node SLURM training job.

The public, importable surface is :mod:`clusterkit.api` (kept free of torch/transformers/deepspeed,
Jinja, rich and paramiko so that importing it is fast on a login node)::

    import clusterkit
    run = clusterkit.submit("recipes/tiny-gpt2-cpu.yaml", {"resources.nodes": 2})
    run.wait(timeout=600)

Each public name is imported on first use (PEP 562): every training rank imports
``clusterkit.runtime.runner`` through this package and must not pay for YAML, Jinja or the loader.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any


def _spare_types_at_exit() -> None:
    """msgspec issue #717: collecting msgspec.Meta-constrained Struct types while the interpreter
    shuts down can crash it (SIGABRT or SIGSEGV, every exit here once a recipe was converted or a
    job.json decoded). At exit, after the CLI or a rank is done, whatever is still alive (the types
    among it, wherever they were defined) is frozen out of reach of the final collection.

    The freeze must happen even when Ctrl-C lands meanwhile (a KeyboardInterrupt out of the
    collection would skip it, and the interpreter crash): SIGINT only marks the exit as
    interrupted until the types are frozen, and the process then exits 130, as a command does."""
    interrupted: list[int] = []
    restore: tuple = ()  # the SIGINT handler to put back, once one of ours replaced it
    try:
        try:
            restore = (signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum)),)
        except ValueError:  # not the main thread: its signals are not ours to handle
            pass
        gc.collect()  # today's garbage is finalized as usual (files flushed, temporary directories removed)
    except KeyboardInterrupt:  # before the handler above was in place
        interrupted.append(signal.SIGINT)
    finally:
        gc.freeze()
    if interrupted:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # closed, gone or None
                pass
        os._exit(130)  # 128 + SIGINT, as the CLI exits on Ctrl-C; nothing is left to collect
    if restore:
        signal.signal(signal.SIGINT, restore[0])


atexit.register(_spare_types_at_exit)

# Public name → the module that defines it.
# No name of a subpackage (load, render, runs...): importing the subpackage would replace the function.
_API = (
    "Run",
    "SubmitChoices",
    "Validation",
    "dry_run",
    "find_run",
    "list_runs",
    "load_recipe",
    "render_job",
    "statuses",
    "submit",
    "validate",
)
_ERRORS = (
    "ClusterkitError",
    "ExternalError",
    "FunctionFailed",
    "RecipeError",
    "RecipeErrors",
    "RunNotFound",
    "SSHError",
    "SchedulerError",
    "SubmitError",
    "UsageError",
    "UserError",
    "WaitTimeout",
)
_FUNCTIONS = ("map_function", "submit_function")
_PUBLIC = {
    **dict.fromkeys(_API, "clusterkit.api"),
    **dict.fromkeys(_FUNCTIONS, "clusterkit.functions"),
    **dict.fromkeys(_ERRORS, "clusterkit.errors"),
    "LoadedRecipe": "clusterkit.load.loader",
    "RenderedJob": "clusterkit.render.job",
    "__version__": "clusterkit.version",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from clusterkit.api import (
        Run,
        SubmitChoices,
        Validation,
        dry_run,
        find_run,
        list_runs,
        load_recipe,
        render_job,
        statuses,
        submit,
        validate,
    )
    from clusterkit.errors import (
        ClusterkitError,
        ExternalError,
        FunctionFailed,
        RecipeError,
        RecipeErrors,
        RunNotFound,
        SchedulerError,
        SSHError,
        SubmitError,
        UsageError,
        UserError,
        WaitTimeout,
    )
    from clusterkit.functions import map_function, submit_function
    from clusterkit.load.loader import LoadedRecipe
    from clusterkit.render.job import RenderedJob
    from clusterkit.version import __version__


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:  # also how ``from clusterkit import cli`` falls through to the submodule
        raise AttributeError(f"module 'clusterkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})

"""A submission prepared: the recipe loaded with every override, rendered, and its dry-run request."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from clusterkit.errors import UsageError, printable
from clusterkit.load.loader import LoadedRecipe, Override, load_recipe
from clusterkit.render.job import render_job
from clusterkit.runs.checkpoint_files import checkpoints_dir, newest_usable
from clusterkit.runs.record import read_record
from clusterkit.schedulers.api import SubmitRequest, dry_run
from clusterkit.spec.profile import expanded


@dataclass(frozen=True)
class SubmitOptions:
    """What a submitting command was asked, as typed values (the CLI's flags, or a Python caller's)."""

    recipe: str | None = None
    overrides: Sequence[str] = ()  # --set texts, in order
    cluster: str | None = None  # a profile name or file, instead of the recipe's
    executor: str | None = None  # a scheduler name; default: the one the machine suggests
    template_dirs: tuple[str, ...] = ()
    resume: str | None = None  # a run directory (or an ssh run's local record) to continue
    from_scratch: bool = False


@dataclass(frozen=True)
class Prepared:
    loaded: LoadedRecipe
    request: SubmitRequest
    notes: list[str] = field(default_factory=list)  # what the user should be told (not errors)


def cluster_override(reference: str) -> Override:
    """``--cluster X``; a path is taken relative to here, not to the recipe."""
    if "/" in reference or reference.endswith((".yaml", ".yml")):
        reference = str(expanded(reference).absolute())
    return Override(("cluster",), reference)


def prepare(options: SubmitOptions, extra: Sequence[Override] = ()) -> Prepared:
    """The request for ``options`` plus clusterkit's own ``extra`` overrides (applied last)."""
    recipe, overrides = options.recipe, [*options.overrides]
    executor, notes = options.executor, []
    if options.resume:
        earlier = read_record(Path(options.resume))
        remote = earlier.scheduler == "ssh"
        # The earlier run's recipe and overrides, then this command's, then where to resume from
        # (for a run submitted over SSH: its run directory on the cluster, and over SSH again).
        recipe = recipe or earlier.recipe
        overrides = [*earlier.overrides, *overrides]
        if options.from_scratch:
            notes.append(f"clusterkit: --from-scratch: running {printable(options.resume)} again from step 0 "
                         "(its checkpoints are not used)")
        else:
            if not remote:  # an SSH run's checkpoints are on the cluster: the job checks there
                found, damaged = newest_usable(checkpoints_dir(Path(options.resume)))
                if found is None:
                    why = f"its complete checkpoints are damaged ({damaged[0][1]})" if damaged else "no complete checkpoint"
                    raise UsageError(f"{options.resume}: nothing to resume: {why}; "
                                     "add --from-scratch to run it again from step 0")
            resume_from = earlier.run_dir if remote else str(Path(options.resume).absolute())
            overrides.append(Override(("resume_from",), resume_from))  # type: ignore[arg-type]
        if remote:
            executor = executor or "ssh"
    elif options.from_scratch:
        raise UsageError("--from-scratch goes with --resume RUN_DIR")
    if recipe is None:
        raise UsageError("give a RECIPE, or --resume RUN_DIR")
    if options.cluster:
        overrides.append(cluster_override(options.cluster))  # type: ignore[arg-type]
    loaded = load_recipe(recipe, [*overrides, *extra])
    request = dry_run(loaded, render_job(loaded, options.template_dirs), executor)
    return Prepared(loaded, request, notes)

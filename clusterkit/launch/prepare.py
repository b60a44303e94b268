"""A submission prepared: the recipe loaded with every override, rendered, and its dry-run request."""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from clusterkit.errors import UsageError, printable
from clusterkit.load.loader import (
    LoadedRecipe,
    Override,
    cluster_override,
    is_program_args,
    load_recipe,
    program_args_override,
)
from clusterkit.load.sweep import load_sweep
from clusterkit.render.job import render_job
from clusterkit.render.sweep import render_sweep
from clusterkit.runs.checkpoint_files import checkpoints_dir, newest_usable
from clusterkit.runs.record import RunRecord, read_record
from clusterkit.schedulers.api import SubmitRequest, dry_run
from clusterkit.spec.function_jobs import RECORD_LAUNCHER
from clusterkit.spec.layout import RUN_RECORD
from clusterkit.spec.resolved import ArrayPlacement


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
    grid: tuple[str, ...] = ()  # --grid key.path=v1,v2: a sweep (with the recipe's sweep: block)
    max_parallel: int | None = None  # the sweep's throttle
    chain: int | None = None  # --chain N: N links, one after another, continuing one run
    after: tuple[str, ...] = ()  # --after: jobs (ids, array tasks <id>_<i>, or run dirs) to start after
    after_type: str = "afterok"  # afterok, afterany or afternotok
    singleton: bool = False  # --singleton: one job of this name (and user) at a time
    # The words after `--`: the script's arguments, after task.args. None: none given (a --resume
    # keeps the earlier run's); given, they replace the earlier run's.
    args: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Prepared:
    loaded: LoadedRecipe
    request: SubmitRequest
    notes: list[str] = field(default_factory=list)  # what the user should be told (not errors)


def prepare(options: SubmitOptions, extra: Sequence[Override] = (), one_job: str | None = None) -> Prepared:
    """The request for ``options`` plus clusterkit's own ``extra`` overrides (applied last).
    ``one_job`` names a command that submits single jobs only: a sweep is refused for it."""
    recipe, overrides = options.recipe, [*options.overrides]
    executor, notes = options.executor, []
    earlier = None
    if options.resume:
        earlier = read_record(Path(options.resume))
        if earlier.launcher == RECORD_LAUNCHER:
            raise UsageError(
                f"{options.resume}: a Python function's run (submit_function) resumes through submitit's "
                "Checkpointable, not --resume: submit the function again"
            )
        remote = earlier.scheduler == "ssh"
        # The earlier run's recipe and overrides, then this command's, then where to resume from
        # (for a run submitted over SSH: its run directory on the cluster, and over SSH again).
        recipe = recipe or earlier.recipe
        kept = [o for o in earlier.overrides if options.args is None or not is_program_args(o)]
        overrides = [*kept, *overrides]
        if options.from_scratch:
            notes.append(
                f"clusterkit: --from-scratch: running {printable(options.resume)} again from step 0 "
                "(its checkpoints are not used)"
            )
        else:
            if not remote:  # an SSH run's checkpoints are on the cluster: the job checks there
                found, damaged = newest_usable(checkpoints_dir(Path(options.resume)))
                if found is None:
                    why = (
                        f"its complete checkpoints are damaged ({damaged[0][1]})"
                        if damaged
                        else "no complete checkpoint"
                    )
                    raise UsageError(
                        f"{options.resume}: nothing to resume: {why}; add --from-scratch to run it again from step 0"
                    )
            resume_from = earlier.run_dir if remote else str(Path(options.resume).absolute())
            overrides.append(Override(("resume_from",), resume_from))  # type: ignore[arg-type]
        # The run continues where it ran (a local executor's run on SLURM here would be another place).
        executor = executor or {"ssh": "ssh", "local": "local"}.get(earlier.scheduler)
    elif options.from_scratch:
        raise UsageError("--from-scratch goes with --resume RUN_DIR")
    if recipe is None:
        raise UsageError("give a RECIPE, or --resume RUN_DIR")
    if options.cluster:
        overrides.append(cluster_override(options.cluster))  # type: ignore[arg-type]
    if options.args:
        overrides.append(program_args_override(options.args))  # type: ignore[arg-type]
    loaded = load_recipe(recipe, [*overrides, *extra])
    if one_job and loaded.recipe.sweep:
        raise UsageError(
            f"{loaded.path}: clusterkit {one_job} runs one job, and this recipe is a sweep (sweep:); "
            "run it without the sweep: --set sweep=null"
        )
    if options.chain:
        loaded = _chained(loaded, options.chain, [*overrides, *extra])
    loaded = tracked(loaded, None if options.from_scratch else earlier, sweep=bool(loaded.recipe.sweep or options.grid))
    dependency = dependency_of(options)
    sweep = load_sweep(loaded, options.grid, options.max_parallel)
    if sweep is None:
        return Prepared(loaded, dry_run(loaded, render_job(loaded, options.template_dirs), executor, dependency), notes)
    # One job array: each task runs its point, and its record keeps that point's overrides.
    request = dry_run(sweep.points[0], render_sweep(sweep, options.template_dirs), executor, dependency)
    request = dataclasses.replace(
        request, overrides=loaded.overrides, task_overrides=tuple(point.overrides for point in sweep.points)
    )
    return Prepared(loaded, request, notes)


def tracked(loaded: LoadedRecipe, earlier: RunRecord | None, sweep: bool) -> LoadedRecipe:
    """The recipe with its tracked run's identity: the earlier run's on --resume (a tracked run
    continued as one), else a fresh id. Set here, once per submit, so job.json and the run record
    (one source: the resolved recipe) name the same run for every start of the job."""
    tracking = loaded.recipe.tracking
    if tracking.tracker == "none":
        return loaded
    if sweep or loaded.recipe.job_kind == "array":
        raise UsageError(
            f"{loaded.path}: tracking: a sweep or job array would report all its tasks as one run; "
            "track single jobs (or --chain, which continues one run)"
        )
    if earlier is not None and earlier.tracking is not None and earlier.tracking.tracker == tracking.tracker:
        identity = {"run_id": earlier.tracking.run_id, "dir": earlier.tracking.dir}
    else:
        identity = {"run_id": tracking.run_id or secrets.token_hex(8), "dir": tracking.dir}
    return dataclasses.replace(
        loaded, recipe=msgspec.structs.replace(loaded.recipe, tracking=msgspec.structs.replace(tracking, **identity))
    )


def _chained(loaded: LoadedRecipe, links: int, overrides: Sequence[str | Override]) -> LoadedRecipe:
    """``--chain N``: the recipe as a job array of N links run one at a time (%1) in one run
    directory, each continuing from the newest complete checkpoint. A link stopped by its time limit
    does not requeue itself (max_requeues 0): the next link is its continuation."""
    if loaded.recipe.sweep or loaded.recipe.array:
        raise UsageError(f"{loaded.path}: --chain continues one run; this recipe is a sweep or a job array")
    if loaded.recipe.steps:
        raise UsageError(f"{loaded.path}: --chain: each link would run every step again; not with steps: yet")
    if loaded.recipe.preemption.max_retries:
        raise UsageError(
            f"{loaded.path}: --chain: a chain's next link already continues a failed one; "
            "set preemption.max_retries to 0"
        )
    if loaded.recipe.preemption.max_requeues:
        loaded = load_recipe(loaded.path, [*overrides, Override(("preemption", "max_requeues"), 0)])
    return dataclasses.replace(
        loaded, recipe=msgspec.structs.replace(loaded.recipe, array=ArrayPlacement(spec=f"0-{links - 1}%1", chain=True))
    )


DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok")


def dependency_of(options: SubmitOptions) -> str | None:
    """sbatch's ``--dependency`` value for ``--after``/``--singleton``: ``afterok:12:13,singleton``.
    A job is a SLURM job id, an array task ``<id>_<index>``, or a run directory (its record's id)."""
    if options.after_type not in DEPENDENCY_TYPES:
        raise UsageError(f"--after-type {options.after_type}: give one of {', '.join(DEPENDENCY_TYPES)}")
    jobs = []
    for reference in options.after:
        if not reference:  # `--after "$JOB"` with JOB unset, or a stray comma: never a job without its dependency
            raise UsageError(
                "--after: an empty job id (an unset variable, or a comma with nothing beside it): "
                "give job ids (123), array tasks (123_4) or run directories"
            )
        if re.fullmatch(r"[0-9]+(_[0-9]+)?", reference):
            jobs.append(reference)
        elif (Path(reference) / RUN_RECORD).is_file():
            jobs.append(read_record(Path(reference)).job_id)
        else:
            raise UsageError(f"--after {reference}: not a job id (123, or an array task 123_4) nor a run directory")
    parts = [":".join([options.after_type, *jobs])] if jobs else []
    return ",".join(parts + (["singleton"] if options.singleton else [])) or None

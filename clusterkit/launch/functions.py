"""Python functions as jobs through submitit (``pip install 'clusterkit[functions]'``): the recipe
gives every executor parameter (spec.function_jobs), the run directory ``<runs_dir>/<name>/<job id>``
is submitit's folder, and a run record there makes the job a run like any other (status, ls, logs).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from clusterkit.errors import Finding, RecipeError, RecipeErrors, SubmitError, UsageError
from clusterkit.load.loader import LoadedRecipe, Override, load_recipe, recipe_file
from clusterkit.load.yaml_source import SourceMap
from clusterkit.runs.function_results import private
from clusterkit.runs.index import add_run
from clusterkit.runs.record import RunRecord
from clusterkit.spec.function_jobs import (
    EXECUTORS,
    LAUNCHER,
    LAUNCHER_REFUSAL,
    LOCAL,
    RECORD_LAUNCHER,
    SLURM,
    executor_parameters,
    refusals,
)

# How submitit runs a job: `python -m submitit.core._submit FOLDER` in each task. As the recipe's task,
# it is validated like any other (and the recipe file itself may not give one).
SUBMITIT_ENTRY = "submitit.core._submit"
_GIVEN_AS = "submit_function"
TASK = (
    Override(("task", "script"), SUBMITIT_ENTRY, _GIVEN_AS),
    Override(("task", "module"), True, _GIVEN_AS),
)
# What submitit stages beside the run directories until the job has an id: the function's pickle(s)
# and the batch script.
_SUBMITIT_STAGING = re.compile(r"[0-9a-f]{32}\.pkl|\.submission_file_[0-9a-f]{32}\.sh")
Call = tuple[Sequence[Any], dict[str, Any]]  # one call's positional and keyword arguments


def load_function_recipe(recipe: str | PathLike[str], overrides: Sequence[str | Override] = ()) -> LoadedRecipe:
    """The recipe with submitit's entry as its task and launcher python's layout (a task per GPU,
    which its CPUs per task are resolved for); one that gives a task, steps or another launcher of
    its own is refused."""

    def no_task_of_its_own(data: dict, source: SourceMap) -> None:
        for key in ("task", "steps"):
            if source.written((key,)):
                raise RecipeError(
                    Finding(source.locate((key,)), (key,), "the function is the job's task: leave it out")
                )
        if source.written(("launcher",)) and data.get("launcher") != LAUNCHER:
            raise RecipeError(Finding(source.locate(("launcher",)), ("launcher",), LAUNCHER_REFUSAL))

    overrides = [Override(("launcher",), LAUNCHER, _GIVEN_AS), *overrides, *TASK]
    return load_recipe(recipe_file(recipe), overrides, as_written=no_task_of_its_own)


def _written(loaded: LoadedRecipe) -> Callable[[tuple[str, ...]], bool]:
    def written(path: tuple[str, ...]) -> bool:
        if path[0] in ("task", "launcher"):  # ours, and refusals() checks the launcher's value
            return False
        return loaded.source.written(path)

    return written


def _executor_name(loaded: LoadedRecipe, executor: str | None) -> str:
    if executor == "ssh":
        raise UsageError(
            "executor: ssh: submit_function submits with this machine's sbatch (submitit), not over SSH; "
            "run it on the login node"
        )
    if loaded.profile.login is not None:
        return "ssh"  # refused, at the profile, by refusals()
    if executor is None:
        from shutil import which

        return SLURM if which("sbatch") else LOCAL
    if executor not in EXECUTORS:
        raise UsageError(f"executor: {executor!r} is not one of {', '.join(EXECUTORS)} for a function")
    return executor


def submit_calls(
    loaded: LoadedRecipe, fn: Callable[..., Any], calls: Sequence[Call], executor: str | None
) -> list[RunRecord]:
    """Each call of ``fn`` as a job (several: one SLURM job array, submitit's ``map_array``); their
    run records, in the calls' order."""
    import submitit

    if not callable(fn):
        raise UsageError(f"submit_function: {fn!r} is not callable")
    if not calls:
        return []
    name = _executor_name(loaded, executor)
    recipe, profile = loaded.recipe, loaded.profile
    base = Path(recipe.runs_dir).expanduser().absolute() / recipe.name
    found = refusals(recipe, profile, name, _written(loaded), str(base))
    if found:
        findings = [Finding(loaded.locate(refusal.key_path), refusal.key_path, refusal.message) for refusal in found]
        raise RecipeErrors(findings) if len(findings) > 1 else RecipeError(findings[0])
    chosen = executor_parameters(recipe, profile, name)
    base.mkdir(parents=True, exist_ok=True)
    # The job unpickles its function from here: a folder someone else can write could swap it.
    private(base, directory=True)
    submitted_at = time.time()
    already = set(os.listdir(base))
    # What submitit writes (the run directory, the function's pickle; on this machine its logs and
    # results; SLURM's job inherits the umask) is private from the start. The umask is the process's:
    # for the moment of the submission.
    umask = os.umask(0o077)
    try:
        auto = submitit.AutoExecutor(folder=base / "%j", cluster=chosen.executor)
        auto.update_parameters(**chosen.parameters)
        if len(calls) > 1:
            auto.update_parameters(slurm_array_parallelism=len(calls))
        with auto.batch():
            jobs = [auto.submit(fn, *args, **kwargs) for args, kwargs in calls]
    except submitit.core.utils.FailedJobError as exc:  # sbatch refused the job: its stderr says why
        for leftover in set(os.listdir(base)) - already:  # submitit's staging: the pickles and the script
            if _SUBMITIT_STAGING.fullmatch(leftover):
                (base / leftover).unlink(missing_ok=True)
        raise SubmitError(f"submitit could not submit the function's job: {exc}") from None
    finally:
        os.umask(umask)
    return [_recorded(loaded, chosen.executor, job.job_id, Path(job.paths.folder), submitted_at) for job in jobs]


def _recorded(loaded: LoadedRecipe, executor: str, job_id: str, run_dir: Path, submitted_at: float) -> RunRecord:
    recipe = loaded.recipe
    # The run directory is private: the results unpickled from it are ours (runs.function_results checks).
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    record = RunRecord(
        job_id=job_id,
        name=recipe.name,
        scheduler=executor,
        run_dir=str(run_dir),
        recipe=str(loaded.path),
        submitted_at=submitted_at,
        nodes=recipe.resources.nodes,
        ranks_per_node=recipe.resources.gpus_per_node,
        launcher=RECORD_LAUNCHER,
        pid=int(job_id) if executor == LOCAL else None,
        overrides=loaded.overrides,
        cluster=loaded.profile.name,
    )
    record.write()
    add_run(record, run_dir)
    return record

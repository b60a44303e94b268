"""The Python API: what the ``clusterkit`` command does, as typed functions and a :class:`Run`
handle (submitit's ``Job``, torchx's runner). The CLI is a thin layer over it: it parses flags,
calls these and prints what they return.

    import clusterkit

    loaded = clusterkit.load_recipe("recipes/tiny-gpt2-cpu.yaml", {"resources.nodes": 2})  # raises RecipeError
    files = clusterkit.render_job(loaded).files           # pure: name -> text, nothing written
    run = clusterkit.submit(loaded, executor="local")   # a Run
    final = run.wait(timeout=600)                       # JobStatus; WaitTimeout if still running
    rows = run.metrics()                                # metrics.jsonl as dicts
    clusterkit.find_run(run.job_id).logs(rank=0)

Errors are typed (:mod:`clusterkit.errors`): a :class:`~clusterkit.errors.UserError` (the recipe, an
argument or a path is wrong; the CLI exits 2) or an :class:`~clusterkit.errors.ExternalError` (SLURM,
the login node or this machine failed; exit 1). Importing this module imports no Jinja, rich,
paramiko or torch; each function imports what it needs when called.
"""

from __future__ import annotations

import collections
import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from clusterkit.errors import UsageError, WaitTimeout
from clusterkit.spec.layout import METRICS

# The loader (YAML, msgspec types) is imported by what loads a recipe, not by status or ls; the
# run modules by what follows a run, not by validate or render.
if TYPE_CHECKING:
    from clusterkit.load.loader import LoadedRecipe, Override
    from clusterkit.render.job import RenderedJob
    from clusterkit.runs.record import RunRecord
    from clusterkit.runs.status import JobStatus
    from clusterkit.schedulers.api import SubmitRequest

# Overrides as a mapping {"resources.nodes": 2} (typed values, nothing parsed) or as --set texts
# ["resources.nodes=2"] (YAML values), applied in order.
Overrides = Union[Mapping[str, Any], Sequence[str], None]
RecipeRef = Union[str, "PathLike[str]", "LoadedRecipe"]
DEFAULT_POLL_S = 2.0
DEFAULT_RUNS_DIR = "./runs"


def overrides_of(overrides: Overrides) -> list[str | Override]:
    from clusterkit.load.loader import Override, parse_key_path

    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise UsageError(f"overrides: give a mapping or a list of key.path=value texts, not the text {overrides!r}")
    if isinstance(overrides, Mapping):
        return [Override(parse_key_path(key), value) for key, value in overrides.items()]
    return list(overrides)


def load_recipe(recipe: str | PathLike[str], overrides: Overrides = None, cluster: str | None = None) -> LoadedRecipe:
    """Load, validate and resolve a recipe; raises :class:`~clusterkit.errors.RecipeError` (each
    finding ``file:line: key: message``). ``cluster``: a profile name or file instead of the recipe's."""
    from clusterkit.load.loader import cluster_override
    from clusterkit.load.loader import load_recipe as load_resolved

    return load_resolved(recipe, [*overrides_of(overrides), *([cluster_override(cluster)] if cluster else [])])


@dataclass(frozen=True)
class Validation:
    """A valid recipe: its warnings (``file:line: warning: key: message``) and its sweep's size."""

    path: str
    warnings: list[str]
    sweep_points: int | None = None  # a sweep: how many points (each one validated too)


def validate(recipe: str | PathLike[str], overrides: Overrides = None, cluster: str | None = None) -> Validation:
    """Check a recipe and, for a sweep, every point; raises :class:`~clusterkit.errors.RecipeError`
    (:class:`~clusterkit.errors.RecipeErrors` for several findings, ``.findings``)."""
    from clusterkit.load.sweep import load_sweep

    loaded = load_recipe(recipe, overrides, cluster)
    sweep = load_sweep(loaded)
    return Validation(str(recipe), [str(warning) for warning in loaded.warnings], len(sweep.points) if sweep else None)


def _loaded(recipe: RecipeRef, overrides: Overrides, cluster: str | None) -> LoadedRecipe:
    from clusterkit.load.loader import LoadedRecipe

    if isinstance(recipe, LoadedRecipe):
        if overrides or cluster:
            raise UsageError("overrides and cluster go with a recipe path; this recipe is already loaded")
        return recipe
    return load_recipe(recipe, overrides, cluster)


def render_job(
    recipe: RecipeRef, template_dirs: Sequence[str] = (), *, overrides: Overrides = None, cluster: str | None = None
) -> RenderedJob:
    """The job's files in memory (``.files``: name -> text, ``.summary``); nothing is written.
    ``template_dirs`` are looked up first (as ``--template-dir``). A sweep renders its array driver
    and each point's files."""
    from clusterkit.load.sweep import load_sweep
    from clusterkit.render.job import render_job as render_one
    from clusterkit.render.sweep import render_sweep

    loaded = _loaded(recipe, overrides, cluster)
    sweep = load_sweep(loaded)
    return render_sweep(sweep, tuple(template_dirs)) if sweep else render_one(loaded, tuple(template_dirs))


@dataclass(frozen=True)
class SubmitChoices:
    """How to submit, beyond the recipe: the CLI's submit flags as keyword arguments."""

    executor: str | None = None  # slurm, ssh or local; default: see schedulers.api.default_scheduler
    template_dirs: Sequence[str] = ()
    resume: str | None = None  # a run directory to continue from its newest checkpoint
    from_scratch: bool = False
    grid: Sequence[str] = ()  # key.path=v1,v2: a sweep
    max_parallel: int | None = None
    chain: int | None = None
    after: Sequence[str] = ()  # job ids, array tasks 123_4 or run directories
    after_type: str = "afterok"
    singleton: bool = False
    # The script's arguments, after task.args (the CLI's words after --), each passed as it is.
    # None: none (a resume keeps the earlier run's); a list replaces them.
    args: Sequence[str] | None = None


def prepare(
    recipe: RecipeRef | None,
    overrides: Overrides = None,
    cluster: str | None = None,
    choices: SubmitChoices = SubmitChoices(),
    extra: Sequence[Override] = (),
    one_job: str | None = None,
):
    """The loaded recipe and the exact request (a :class:`~clusterkit.launch.prepare.Prepared`)."""
    from clusterkit.launch.prepare import SubmitOptions
    from clusterkit.launch.prepare import prepare as prepare_request
    from clusterkit.load.loader import LoadedRecipe

    if isinstance(recipe, LoadedRecipe):  # loaded once more with the submit's own overrides (resume, chain)
        overrides = [*recipe.overrides, *overrides_of(overrides)]
        recipe = str(recipe.path)
    options = SubmitOptions(
        recipe=None if recipe is None else str(recipe),
        overrides=tuple(overrides_of(overrides)),
        cluster=cluster,
        executor=choices.executor,
        template_dirs=tuple(choices.template_dirs),
        resume=choices.resume,
        from_scratch=choices.from_scratch,
        grid=tuple(choices.grid),
        max_parallel=choices.max_parallel,
        chain=choices.chain,
        after=tuple(choices.after),
        after_type=choices.after_type,
        singleton=choices.singleton,
        args=None if choices.args is None else _program_args(choices.args),
    )
    return prepare_request(options, extra, one_job)


def _program_args(args: Sequence[str]) -> tuple[str, ...]:
    if isinstance(args, str):  # a text would be taken as its characters
        raise UsageError(f"args: give a list of arguments, not the text {args!r}")
    return tuple(args)


def dry_run(
    recipe: RecipeRef | None, overrides: Overrides = None, cluster: str | None = None, **choices: Any
) -> SubmitRequest:
    """The exact request :func:`submit` would send (``.argv``, ``.script``, ``.files``), sending nothing."""
    return prepare(recipe, overrides, cluster, SubmitChoices(**choices)).request


def submit(
    recipe: RecipeRef | None,
    overrides: Overrides = None,
    cluster: str | None = None,
    accept_new_host_key: bool = False,
    **choices: Any,
) -> Run:
    """Validate, render and submit; the :class:`Run`. ``choices``: see :class:`SubmitChoices`."""
    from clusterkit.schedulers.api import schedule

    request = dry_run(recipe, overrides, cluster, **choices)
    return Run(schedule(request, accept_new_host_key), accept_new_host_key)


@dataclass(frozen=True)
class Run:
    """A submitted run, wherever it lives (this machine, SLURM here, or a login node over SSH)."""

    record: RunRecord
    accept_new_host_key: bool = False

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def run_dir(self) -> str:
        """The run directory: on this machine, or (an ssh run) on the login node."""
        return self.record.run_dir

    @property
    def tasks(self) -> list[Run]:
        """A job array's tasks (a sweep's points), each a run of its own."""
        from clusterkit.runs.arrays import task_record

        return [Run(task_record(self.record, index), self.accept_new_host_key) for index in self.record.tasks]

    def _scheduler(self):
        from clusterkit.schedulers.api import login_of, open_scheduler

        return open_scheduler(self.record.scheduler, login_of(self.record), self.accept_new_host_key)

    def status(self) -> JobStatus:
        with self._scheduler() as scheduler:
            return scheduler.status(self.record)

    def logs(self, rank: int | None = None) -> str:
        """Every node's launcher output, or one global rank's own output, as text."""
        world = self.record.nodes * self.record.ranks_per_node
        if self.record.tasks:
            raise UsageError(f"job {self.job_id} is an array: ask one of its .tasks for logs")
        if rank is not None and not 0 <= rank < world:
            raise UsageError(f"rank {rank} is not in this run ({'rank 0' if world == 1 else f'ranks 0-{world - 1}'})")
        sink = io.BytesIO()
        with self._scheduler() as scheduler:
            scheduler.logs(self.record, rank, False, sink)
        return sink.getvalue().decode("utf-8", "replace")

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of metrics.jsonl written so far (step, loss, samples/s, ...); none yet: []."""
        from clusterkit.runs.logs import METRICS_LIMIT, read_run_file

        with self._scheduler() as scheduler:
            try:
                text = read_run_file(scheduler.run_file(self.record, METRICS), METRICS_LIMIT, "the run's metrics")
            except FileNotFoundError:
                return []
        from clusterkit.runs.record import metric_records

        return metric_records(text)

    def wait(self, timeout: float | None = None, poll_s: float = DEFAULT_POLL_S) -> JobStatus:
        """Until the run ends: its final status. :class:`~clusterkit.errors.WaitTimeout` after
        ``timeout`` seconds (the run goes on). Asked every ``poll_s`` while its state changes, less
        often while it does not (:mod:`clusterkit.runs.poll`)."""
        from clusterkit.runs.poll import Backoff, poll

        deadline = None if timeout is None else time.monotonic() + timeout

        def sleep(seconds: float) -> None:
            time.sleep(seconds if deadline is None else max(0.0, min(seconds, deadline - time.monotonic())))

        with self._scheduler() as scheduler:
            polled = poll(
                lambda: scheduler.status(self.record),
                lambda status: status.done or deadline is not None and time.monotonic() >= deadline,
                Backoff(first_s=poll_s),
                sleep,
            )
            (status,) = collections.deque(polled, maxlen=1)  # the last answer: done, or the deadline passed
        if not status.done:
            raise WaitTimeout(f"job {self.job_id} is still {status.state} after {timeout:g} s")
        return status

    def stacks(self, timeout_s: float = 30.0) -> dict:
        """Every rank's Python stacks now, taken by the job's supervisor inside the allocation
        (docs/json.md: "stacks"). Only a running job has them."""
        from clusterkit.errors import SchedulerError
        from clusterkit.runs.stacks import read_summary
        from clusterkit.runs.status import RUNNING
        from clusterkit.spec.layout import STACKS_SUMMARY

        if self.record.tasks:
            raise UsageError(f"job {self.job_id} is an array: ask one of its tasks for stacks")
        with self._scheduler() as scheduler:
            state = scheduler.status(self.record).state
            if state != RUNNING:
                raise UsageError(f"job {self.job_id} is {state}: stacks are taken from a running job")
            file = scheduler.run_file(self.record, STACKS_SUMMARY)
            before = (read_summary(file) or {}).get("serial", 0)
            scheduler.ask_stacks(self.record)
            deadline = time.monotonic() + timeout_s
            while True:
                summary = read_summary(file)
                if summary is not None and summary["serial"] > before:
                    return summary
                if time.monotonic() >= deadline:
                    raise SchedulerError(
                        f"job {self.job_id}: its supervisor did not answer within {timeout_s:g} s "
                        "(it takes stacks while the launch runs: not during setup, the preflight or a service's start)"
                    )
                time.sleep(0.3)

    def result(self, timeout: float | None = None) -> Any:
        """A function's run (:func:`clusterkit.submit_function`): its value (a function of several
        tasks: rank 0's) once the run has ended (:meth:`wait`);
        :class:`~clusterkit.errors.FunctionFailed` with the remote traceback and log tail if it raised.
        Read only from a run directory private to you; UsageError for a run that is no function's."""
        return self.results(timeout)[0]

    def results(self, timeout: float | None = None) -> list[Any]:
        """A function's run: every task's value, in rank order."""
        from clusterkit.runs.function_results import results

        self.wait(timeout)
        return results(self.record)

    def cancel(self) -> bool:
        """Cancel the run unless it has ended; whether it was cancelled."""
        with self._scheduler() as scheduler:
            if scheduler.status(self.record).done:
                return False
            scheduler.cancel(self.record)
            return True


def default_runs_dir() -> str:
    """Where runs are looked for when no directory is given: the user config's runs_dir, else ./runs."""
    from clusterkit.load.user_config import load_user_config

    return load_user_config().config.runs_dir or DEFAULT_RUNS_DIR


def _record(job: str, runs_dir: Path) -> RunRecord:
    """Under ``runs_dir`` first (or the run directory given), then in the run index of every run
    submitted from this machine (so a job id is found from any directory)."""
    from clusterkit.errors import RunNotFound
    from clusterkit.runs.index import find_indexed
    from clusterkit.runs.record import find_run as find_record

    try:
        return find_record(job, runs_dir)
    except RunNotFound:
        found = find_indexed(job)
        if found is None:
            raise
        return found


def find_run(job: str, runs_dir: str | PathLike[str] | None = None, accept_new_host_key: bool = False) -> Run:
    """A run by job id (an array task ``123_4`` too) under ``runs_dir`` or in the run index, or by
    its run directory; :class:`~clusterkit.errors.RunNotFound` if there is none."""
    from clusterkit.errors import RunNotFound
    from clusterkit.runs.arrays import task_record

    where = Path(runs_dir or default_runs_dir())
    try:
        return Run(_record(job, where), accept_new_host_key)
    except RunNotFound:
        # A task of an array whose tasks have no record here (submitted over SSH): the array's says it.
        array_id, _, index = job.rpartition("_")
        if not (array_id and index.isdigit()):
            raise
        array = _record(array_id, where)
        if int(index) not in array.tasks:
            raise RunNotFound(
                f"job {array_id} has no task {index} (tasks {', '.join(map(str, array.tasks))})"
            ) from None
        return Run(task_record(array, int(index)), accept_new_host_key)


def list_runs(runs_dir: str | PathLike[str] | None = None, limit: int | None = None) -> list[Run]:
    """The runs under ``runs_dir``, newest first (a damaged record is skipped with a warning); where
    there is no such directory here, those of the run index (every run submitted from this machine)."""
    import itertools

    from clusterkit.runs.index import indexed_runs
    from clusterkit.runs.record import list_runs as list_records

    where = Path(runs_dir or default_runs_dir())
    records = list_records(where)[:limit] if where.is_dir() else list(itertools.islice(indexed_runs(), limit))
    return [Run(record) for record in records]


def statuses(found: Sequence[Run], unreachable_ok: bool = False) -> list[JobStatus]:
    """Each run's status, asking each scheduler (and login node) once for all of its runs."""
    from clusterkit.schedulers.api import statuses as scheduler_statuses

    return scheduler_statuses(
        [run.record for run in found], any(run.accept_new_host_key for run in found), unreachable_ok
    )

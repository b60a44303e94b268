"""A job of several steps (the recipe's ``steps:``, the plan's ``steps``): each run in order, a
step's trials one after another, each an srun step of its own with its logs in
``steps/<name>[/<trial>]/``. The first run that fails ends the job with its exit code; the runs
after it do not start. ``steps.jsonl`` gets a line as each run starts and ends: status names the
failing step from it, and a requeued job (preempted: the same job id, started again) goes on from
the first run it had not completed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, List, Set, Tuple

from .plan import LaunchPlan, Step
from .run_files import STEPS_RECORD, json_objects, step_dir


def runs(plan: LaunchPlan) -> List[Tuple[Step, int]]:
    """Every run of a step, in order: each step's trials 0, 1, ..."""
    return [(step, trial) for step in plan.steps for trial in range(step.repeat)]


def label(name: str, trial: int, repeat: int) -> str:
    """How the logs and status name a run: ``train``, or ``eval trial 2 (of 3)``."""
    return name if repeat == 1 else f"{name} trial {trial} (of {repeat})"


def logs_dir(step: Step, trial: int) -> str:
    """The run's log folder below the run directory (the plan's logs hold ``{trial}`` for trials)."""
    return step_dir(step.name, trial if step.repeat > 1 else None)


def completed(run_dir: Path, job_id: str) -> Set[Tuple[str, int]]:
    """The runs this job (an earlier start of it, before a requeue) completed: ended with 0, not interrupted."""
    try:
        text = (run_dir / STEPS_RECORD).read_text(errors="replace")
    except OSError:
        return set()
    return {
        (str(entry.get("step")), entry.get("trial"))
        for entry in json_objects(text)
        if entry.get("job_id") == job_id and entry.get("exit_code") == 0 and not entry.get("interrupted")
    }


def _record(run_dir: Path, entry: dict) -> None:
    try:
        with open(run_dir / STEPS_RECORD, "a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")
    except OSError as exc:
        print(f"clusterkit: cannot record the step in {run_dir / STEPS_RECORD}: {exc.strerror}", flush=True)


def run_steps(
    plan: LaunchPlan,
    run_dir: Path,
    job_id: str,
    run: Callable[[Step, int], int],
    interrupted: Callable[[], bool],
) -> int:
    """Carry the steps out: ``run(step, trial)`` starts one and returns its exit code; ``interrupted()``
    says the job stopped to start again (preempted, or requeued by itself), so the run is not complete
    and nothing after it starts. Returns the first failing run's exit code, else 0."""
    done = completed(run_dir, job_id)
    count = len(runs(plan))
    for number, (step, trial) in enumerate(runs(plan), 1):
        name = label(step.name, trial, step.repeat)
        if (step.name, trial) in done:
            print(
                f"clusterkit: step {name} ({number} of {count}) completed before this restart: not run again",
                flush=True,
            )
            continue
        (run_dir / logs_dir(step, trial)).mkdir(parents=True, exist_ok=True)  # srun opens its logs there
        base = {"step": step.name, "trial": trial, "repeat": step.repeat, "job_id": job_id}
        _record(run_dir, {**base, "started_at": round(time.time(), 3)})
        print(f"clusterkit: step {name} ({number} of {count}) starting, logs in {logs_dir(step, trial)}/", flush=True)
        code = run(step, trial)
        stopped = interrupted()
        ended = {"ended_at": round(time.time(), 3), "exit_code": code, **({"interrupted": True} if stopped else {})}
        _record(run_dir, {**base, **ended})
        if code or stopped:
            later = count - number
            after = f"; the {later} run(s) after it do not start" if later else ""
            print(f"clusterkit: step {name} ({number} of {count}) exited with {code}{after}", flush=True)
            return code
        print(f"clusterkit: step {name} ({number} of {count}) done", flush=True)
    return 0

"""After the launch: a preempted run requeued, a failed run retried as a new job without the node
the failure began on, and the end of the secrets file once nothing will read it again.

- Requeue happens here, on the batch host, never in a rank: images seldom have ``scontrol``. The
  runner stops at a step boundary, rank 0 writes ``preempted.json`` (the step), and the ranks exit 0;
  this job is then requeued while fewer than ``max_requeues`` restarts happened (an array task by its
  own ``<array id>_<task id>``), else the record says why not.
- A retry is a new job (a running job's nodes cannot change), held until ``retries.jsonl`` names it,
  excluding every node excluded so far: the recipe's own ``--exclude``, each earlier retry's, the
  node where this failure began or, with ``preflight.on_slow: exclude``, the slow ones, or, when the
  watchdog ended a hung launch, the nodes of the ranks that were elsewhere than the others.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .environment import JobEnvironment
from .plan import LaunchPlan
from .run_files import JOB_SCRIPT, PREEMPTED_RECORD, PREFLIGHT_RESULT, REQUEUED, RETRIES, batch_log, node_exit

EXIT_PREEMPTED = 85  # the job's exit code when it stopped for preemption and was not requeued


def preempted_step(run_dir: Path) -> Optional[dict]:
    """The runner's preemption record of this attempt, if it wrote one."""
    try:
        record = json.loads((run_dir / PREEMPTED_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def requeue_if_possible(plan: LaunchPlan, job: JobEnvironment, run_dir: Path, record: dict) -> bool:
    """Requeue a preempted job (True), or complete its record with why not (False)."""
    restarts, limit = job.restarts, plan.recovery.max_requeues
    if job.can_requeue and restarts < limit:
        print(
            f"clusterkit: preempted at step {record.get('step')}; requeueing job {job.job_id} "
            f"(restart {restarts + 1} of at most {limit})",
            flush=True,
        )
        (run_dir / PREEMPTED_RECORD).unlink()  # a requeued run is not a stopped one
        _write_whole(run_dir / REQUEUED, json.dumps({"step": record.get("step"), "restart": restarts + 1}) + "\n")
        if job.requeue():
            return True
        (run_dir / REQUEUED).unlink()  # not started again: this is the end
        reason = "scontrol requeue failed"
    else:
        reason = f"max_requeues ({limit}) reached" if job.can_requeue else f"the {job.executor} executor cannot requeue"
    _write_whole(
        run_dir / PREEMPTED_RECORD,
        json.dumps({**record, "restarts": restarts, "max_requeues": limit, "reason": reason}) + "\n",
    )
    print(
        f"clusterkit: preempted at step {record.get('step')}; {reason}: not requeued. "
        f"Continue with: clusterkit submit --resume {run_dir}",
        flush=True,
    )
    return False


def first_failure(run_dir: Path) -> Optional[Tuple[float, int]]:
    """When and on which node a program first ended with a non-zero code (each node records it)."""
    ended = []
    for path in run_dir.glob(node_exit("*")):
        try:
            when, code = path.read_text().split()
            if code != "0":
                ended.append((float(when), int(path.stem[len("node") :])))
        except (OSError, ValueError):
            continue
    return min(ended) if ended else None


def failed_node(run_dir: Path) -> Optional[int]:
    """The node whose program ended first with a non-zero code."""
    first = first_failure(run_dir)
    return first[1] if first else None


def excluded_so_far(run_dir: Path) -> List[str]:
    """The hosts earlier retries of this run excluded."""
    hosts: List[str] = []
    try:
        lines = (run_dir / RETRIES).read_text().splitlines()
    except OSError:
        return hosts
    for line in lines:
        try:
            excluded = json.loads(line).get("excluded") or ""
        except (ValueError, AttributeError):
            continue
        hosts += [host for host in str(excluded).split(",") if host]
    return hosts


def slow_hosts(run_dir: Path, hosts: Sequence[str]) -> List[str]:
    """The hosts the preflight named slow (by node index)."""
    try:
        slow = json.loads((run_dir / PREFLIGHT_RESULT).read_text()).get("slow_nodes") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [hosts[index] for index in slow if isinstance(index, int) and 0 <= index < len(hosts)]


def retry(
    plan: LaunchPlan,
    job: JobEnvironment,
    run_dir: Path,
    hosts: Sequence[str],
    environ: Mapping[str, str],
    exclude: Optional[Sequence[str]] = None,
    dropped: Sequence[str] = (),
) -> Optional[str]:
    """Submit the next retry of this run: its job id, or None where none is due or sbatch refused.
    It runs without every host excluded so far, the nodes this job dropped for a spare (``dropped``)
    and ``exclude`` (None: the node where the failure began)."""
    attempt = job.retry + 1
    if attempt > plan.recovery.max_retries or not job.can_submit:
        return None
    # The hosts named (the preflight's slow nodes, a hang's odd ranks': every node's program then
    # ended non-zero together, so which ended first says nothing); else where the failure began.
    node = failed_node(run_dir) if exclude is None else None
    new = list(exclude) if exclude is not None else [hosts[node]] if node is not None and node < len(hosts) else []
    excluded = list(dict.fromkeys([*plan.recovery.exclude, *excluded_so_far(run_dir), *dropped, *new]))
    # The secrets stay out of sbatch's environment (SLURM stores it with the job): the retry reads
    # their file, as the first job did.
    env: Dict[str, str] = {name: value for name, value in environ.items() if name not in plan.secrets}
    env.update(CLUSTERKIT_RETRY=str(attempt), CLUSTERKIT_RETRY_OF=job.retry_of)
    argv = [
        "sbatch",
        "--parsable",
        "--hold",
        "--export=ALL,CLUSTERKIT_RETRY,CLUSTERKIT_RETRY_OF",
        *([f"--exclude={','.join(excluded)}"] if excluded else []),
        f"--chdir={job.submit_dir}",
        f"--output={run_dir}/{batch_log('%j', 'out')}",
        f"--error={run_dir}/{batch_log('%j', 'err')}",
        str(run_dir / JOB_SCRIPT),
    ]
    limit = plan.recovery.max_retries
    next_job = job.submit_held(argv, env)
    if next_job is None:
        print(f"clusterkit: retry {attempt} of {limit} could not be submitted", flush=True)
        return None
    with (run_dir / RETRIES).open("a") as record:  # read by the retry itself before it takes this run over
        record.write(
            json.dumps(
                {
                    "retry": attempt,
                    "job_id": next_job,
                    "after_job": job.slurm_job_id,
                    "excluded": ",".join(excluded),
                    "node": "" if node is None else str(node),
                }
            )
            + "\n"
        )
    job.release(next_job)
    why = f", excluding {','.join(excluded)}" if excluded else ""
    print(
        f"clusterkit: retry {attempt} of {limit}: job {next_job}{why}"
        + (f" (node {node}, where the failure began)" if node is not None else ""),
        flush=True,
    )
    return next_job


def end_secrets(path: Optional[Path]) -> None:
    """The run's end: its secrets file goes (no later attempt will read it)."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _write_whole(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    os.replace(staging, path)

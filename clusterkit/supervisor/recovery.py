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
- At most one retry per failed job, whoever submits it: the supervisor here, or ``clusterkit watch``
  on the login node when this process could not (a node that died, a batch shell that was killed).
  Each takes the run's ``retries.lock`` (``flock``), and under it reads ``retries.jsonl``: a line whose
  ``after_job`` is the failed job means the retry is done; ``cancelled`` (``clusterkit cancel``)
  means none is wanted. The submit and the line are made under the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .environment import JobEnvironment
from .plan import LaunchPlan
from .run_files import (
    CANCELLED_MARKER,
    JOB_SCRIPT,
    PREEMPTED_RECORD,
    PREFLIGHT_RESULT,
    REQUEUED,
    RESTARTS,
    RETRIES,
    RETRY_LOCK,
    batch_log,
    json_objects,
    node_exit,
    write_whole,
)

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
        write_whole(run_dir / REQUEUED, json.dumps({"step": record.get("step"), "restart": restarts + 1}) + "\n")
        if job.requeue():
            return True
        (run_dir / REQUEUED).unlink()  # not started again: this is the end
        reason = "scontrol requeue failed"
    else:
        reason = f"max_requeues ({limit}) reached" if job.can_requeue else f"the {job.executor} executor cannot requeue"
    write_whole(
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


def retry_records(run_dir: Path) -> List[dict]:
    """The lines of the run's retries.jsonl (each retry submitted), damaged ones left out."""
    try:
        return json_objects((run_dir / RETRIES).read_text())
    except OSError:
        return []


def excluded_so_far(run_dir: Path) -> List[str]:
    """The hosts earlier retries of this run excluded, and the nodes its jobs dropped for a spare."""
    hosts = [host for record in retry_records(run_dir) for host in str(record.get("excluded") or "").split(",") if host]
    try:
        restarts = json_objects((run_dir / RESTARTS).read_text())
    except OSError:
        return hosts
    return hosts + [host for restart in restarts for host in restart.get("dropped") or () if isinstance(host, str)]


def slow_hosts(run_dir: Path, hosts: Sequence[str]) -> List[str]:
    """The hosts the preflight named slow (by node index)."""
    try:
        slow = json.loads((run_dir / PREFLIGHT_RESULT).read_text()).get("slow_nodes") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [hosts[index] for index in slow if isinstance(index, int) and 0 <= index < len(hosts)]


@contextlib.contextmanager
def retry_lock(run_dir: Path) -> Iterator[None]:
    """The run's retry decision to oneself: an exclusive ``flock`` on its ``retries.lock``, waited for.
    Held across one login node's processes and the batch host's only where the file system passes
    flock on (NFSv4 and Lustre with ``flock`` mounted do; NFSv3 without lockd does not)."""
    # Not a FIFO or a link someone put there: opened without blocking and following, and checked.
    fd = os.open(
        str(run_dir / RETRY_LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
    )
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{run_dir / RETRY_LOCK} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


class Retried(NamedTuple):
    job_id: Optional[str]  # the job that continues the run after the failed one (None: none)
    new: bool  # submitted by this call (False: one recorded before, or none)
    why_not: str = ""  # where there is none: why


def retry(
    plan: LaunchPlan,
    job: JobEnvironment,
    run_dir: Path,
    hosts: Sequence[str],
    environ: Mapping[str, str],
    exclude: Optional[Sequence[str]] = None,
) -> Optional[str]:
    """Submit the next retry of this run: its job id (or that of the retry recorded for this job
    already, by ``clusterkit watch``), or None where none is due or sbatch refused. It runs without
    every host excluded so far and ``exclude`` (None: the node where the failure began)."""
    return retry_after(plan, job, run_dir, hosts, environ, exclude).job_id


def retry_after(
    plan: LaunchPlan,
    job: JobEnvironment,
    run_dir: Path,
    hosts: Sequence[str],
    environ: Mapping[str, str],
    exclude: Optional[Sequence[str]] = None,
    by: str = "supervisor",
    cause: str = "",
) -> Retried:
    """The retry after ``job`` (whose id, retry number and first job its environment says), decided
    and recorded under the run's retry lock: one already recorded for this job is the answer; else
    one is submitted held, recorded (``by``, ``cause``) and released. ``environ``: what sbatch runs in."""
    attempt = job.retry + 1
    limit = plan.recovery.max_retries
    if attempt > limit or not job.can_submit:
        return Retried(None, False, f"max_retries ({limit}) reached" if job.can_submit else "nothing can queue a retry")
    with retry_lock(run_dir):
        done = [r for r in retry_records(run_dir) if str(r.get("after_job")) == job.slurm_job_id and r.get("job_id")]
        if done:
            return Retried(str(done[-1]["job_id"]), False, "")
        if (run_dir / CANCELLED_MARKER).exists():
            print("clusterkit: the run was cancelled (clusterkit cancel): not retried", flush=True)
            return Retried(None, False, "cancelled by clusterkit cancel")
        return _submit_retry(plan, job, run_dir, hosts, environ, exclude, attempt, by, cause)


def _submit_retry(
    plan: LaunchPlan,
    job: JobEnvironment,
    run_dir: Path,
    hosts: Sequence[str],
    environ: Mapping[str, str],
    exclude: Optional[Sequence[str]],
    attempt: int,
    by: str,
    cause: str,
) -> Retried:
    # The hosts named (the preflight's slow nodes, a hang's odd ranks': every node's program then
    # ended non-zero together, so which ended first says nothing); else where the failure began.
    node = failed_node(run_dir) if exclude is None else None
    new = list(exclude) if exclude is not None else [hosts[node]] if node is not None and node < len(hosts) else []
    excluded = list(dict.fromkeys([*plan.recovery.exclude, *excluded_so_far(run_dir), *new]))
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
        return Retried(None, False, "sbatch refused it")
    with (run_dir / RETRIES).open("a") as record:  # read by the retry itself before it takes this run over
        record.write(
            json.dumps(
                {
                    "retry": attempt,
                    "job_id": next_job,
                    "after_job": job.slurm_job_id,
                    "excluded": ",".join(excluded),
                    "node": "" if node is None else str(node),
                    "by": by,
                    **({"cause": cause} if cause else {}),
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
    return Retried(next_job, True)


def end_secrets(path: Optional[Path]) -> None:
    """The run's end: its secrets file goes (no later attempt will read it)."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass

"""``clusterkit watch``: the login node's side of recovery, for what the job cannot do itself.

The supervisor retries a failed launch from inside the job; it cannot when the job is gone from
under it: a node died (NODE_FAIL), the allocation never booted (BOOT_FAIL), SLURM preempted the job
without requeueing it (PREEMPTED), or its batch shell was killed (the job ended CANCELLED or FAILED
and the supervisor wrote no ``exit_code``). Each pass asks SLURM once for every watched run's
current job (its newest retry's, as status follows them): one ``squeue``, and one ``sacct`` only
for the jobs the controller has forgotten. Each such event, named by the failed job's id, gets the
retry the supervisor would have submitted (:func:`clusterkit.supervisor.recovery.retry_after`:
the same argv and environment, bounded by the plan's ``max_retries``, under the run's retry lock,
recorded in ``retries.jsonl`` with ``"by": "watch"``), at most once whoever else watches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from clusterkit.errors import SchedulerError
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import exit_code_from_run_dir
from clusterkit.schedulers.host import Host
from clusterkit.schedulers.slurm import SUBMIT_TIMEOUT_S, parse_job_id
from clusterkit.schedulers.slurm_queue import squeue_argv
from clusterkit.spec.layout import CANCELLED_MARKER, LAUNCH_PLAN
from clusterkit.supervisor.environment import JobEnvironment
from clusterkit.supervisor.plan import PlanError, load_plan
from clusterkit.supervisor.recovery import Retried, retry_after, retry_records

NODE_CAUSES = frozenset({"NODE_FAIL", "BOOT_FAIL"})  # the job's nodes are why: the retry runs without them
# Ended without the supervisor's outcome: its batch shell was killed (or SLURM ended the job at once).
KILLED_STATES = frozenset({"CANCELLED", "FAILED"})

# squeue's fields for the watcher; WorkDir last, read as the rest of the line (a path may hold "|").
_FIELDS = ("JobID", "State", "NodeList", "WorkDir")
WATCH_FORMAT = ",".join(f"{name}:0|" for name in _FIELDS)
SACCT_FORMAT = ",".join(("JobIDRaw", "State", "NodeList", "WorkDir"))


@dataclasses.dataclass(frozen=True)
class Seen:
    """What SLURM says of a job: its state word (``NODE_FAIL``), its nodes (a hostlist), where it ran from."""

    state: str
    nodes: str
    work_dir: str


def _lines(output: str) -> Iterator[tuple[str, Seen]]:
    for line in output.splitlines():
        fields = line.rstrip("|").split("|", 3)
        if len(fields) == 4 and fields[0].isdigit():
            job_id, state, nodes, work_dir = (field.strip() for field in fields)
            yield job_id, Seen(state.split(" ")[0].rstrip("+").upper(), nodes, work_dir)


def ask_jobs(host: Host, job_ids: Sequence[str]) -> dict[str, Seen]:
    """What SLURM says of each job: one squeue for all; one sacct for those squeue no longer lists
    (no answer from sacct, as on a cluster without accounting: they are left out)."""
    if not job_ids:
        return {}
    done = host.run(squeue_argv(sorted(set(job_ids)), WATCH_FORMAT))
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SchedulerError(f"squeue failed ({done.returncode}): {said[-1] if said else 'no output'}")
    seen = {job_id: found for job_id, found in _lines(done.stdout) if job_id in job_ids}
    forgotten = sorted(set(job_ids) - set(seen))
    if forgotten:
        argv = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={','.join(forgotten)}"]
        accounted = host.run([*argv, f"--format={SACCT_FORMAT}"])
        if accounted.returncode == 0:
            seen.update((job_id, found) for job_id, found in _lines(accounted.stdout) if job_id in forgotten)
    return seen


@dataclasses.dataclass(frozen=True)
class Event:
    """A run's current job ended the way only the watcher can answer."""

    record: RunRecord
    job_id: str  # the failed job
    retry: int  # which retry of the run it was (0: the first job)
    cause: str  # SLURM's state
    seen: Seen

    def words(self, nodes: Sequence[str]) -> str:
        cause = (
            self.cause if self.cause not in KILLED_STATES else f"{self.cause} without an exit code (batch shell killed)"
        )
        where = f" on {','.join(nodes)}" if nodes else ""
        return f"watch: run {self.record.job_id} (job {self.job_id}) ended {cause}{where}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    event: Event
    nodes: tuple[str, ...]  # the failed job's nodes where they are why
    retried: Retried
    excluded: str = ""

    @property
    def line(self) -> str:
        said = self.event.words(self.nodes)
        if self.retried.new:
            why = f" excluding {self.excluded}" if self.excluded else ""
            return f"{said}: resubmitted as job {self.retried.job_id}{why}"
        if self.retried.job_id:
            return f"{said}: already retried as job {self.retried.job_id}"
        return f"{said}: not resubmitted: {self.retried.why_not}"

    def to_json(self) -> dict:
        return {
            "run": self.event.record.job_id,
            "run_dir": self.event.record.run_dir,
            "job": self.event.job_id,
            "cause": self.event.cause,
            "nodes": list(self.nodes),
            "resubmitted": self.retried.new,
            "new_job": self.retried.job_id,
            "excluded": self.excluded,
            "why_not": self.retried.why_not or None,
        }


def current_job(record: RunRecord) -> tuple[str, int]:
    """The job that runs the run now (its newest retry's, as status follows them) and its retry number."""
    valid = [r for r in retry_records(record.path) if str(r.get("job_id", "")).isdigit()]
    if not valid:
        return record.job_id, 0
    retry = valid[-1].get("retry")
    return str(valid[-1]["job_id"]), retry if isinstance(retry, int) and retry >= 0 else len(valid)


def events(
    records: Sequence[RunRecord], seen: Mapping[str, Seen], current: Mapping[str, tuple[str, int]]
) -> list[Event]:
    """The runs whose current job ended the way only the watcher can answer."""
    found = []
    for record in records:
        job_id, retry = current[record.run_dir]
        job = seen.get(job_id)
        if job is None or (record.path / CANCELLED_MARKER).exists():
            continue  # unknown to SLURM (too long ago to tell how it ended), or cancelled on purpose
        killed = job.state in KILLED_STATES and exit_code_from_run_dir(record.path) is None
        if job.state in NODE_CAUSES or job.state == "PREEMPTED" or killed:
            found.append(Event(record, job_id, retry, job.state, job))
    return found


class WatchedJob(JobEnvironment):
    """The failed job as the supervisor's retry sees its own: its id, retry number, first job and
    submit directory; its sbatch and scontrol go through ``host``, in this process's environment
    ``base`` changed as the retry asks (``env -u`` for what it leaves out, NAME=value for what it sets)."""

    executor = "slurm"
    can_submit = True

    def __init__(self, host: Host, event: Event, base: Mapping[str, str]) -> None:
        super().__init__(
            {
                "SLURM_JOB_ID": event.job_id,
                "CLUSTERKIT_RETRY": str(event.retry),
                "CLUSTERKIT_RETRY_OF": event.record.job_id,
                "SLURM_SUBMIT_DIR": event.seen.work_dir or event.record.run_dir,
            }
        )
        self.host, self.base = host, dict(base)

    def submit_held(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        unset = [word for name in sorted(set(self.base) - set(env)) for word in ("-u", name)]
        changed = [f"{name}={value}" for name, value in env.items() if self.base.get(name) != value]
        done = self.host.run(["env", *unset, *changed, *argv], timeout=SUBMIT_TIMEOUT_S)
        try:
            return parse_job_id(done.stdout) if done.returncode == 0 else None
        except SchedulerError:
            return None

    def release(self, job_id: str) -> bool:
        return self.host.run(["scontrol", "release", job_id]).returncode == 0


def answer(host: Host, event: Event, base: Mapping[str, str]) -> Outcome:
    """The event's retry, as the plan's recovery policy allows, or why there is none."""
    run_dir = event.record.path
    nodes: tuple[str, ...] = ()
    if event.cause in NODE_CAUSES and event.seen.nodes:
        listed = host.run(["scontrol", "show", "hostnames", event.seen.nodes])
        nodes = tuple(listed.stdout.split()) if listed.returncode == 0 else (event.seen.nodes,)
    try:
        plan = load_plan((run_dir / LAUNCH_PLAN).read_text())
    except (OSError, PlanError) as exc:
        return Outcome(event, nodes, Retried(None, False, f"cannot read {run_dir / LAUNCH_PLAN}: {exc}"))
    if plan.secrets_file and not (run_dir / plan.secrets_file).exists():
        return Outcome(event, nodes, Retried(None, False, "its secrets file is gone (the run had ended)"))
    job = WatchedJob(host, event, base)
    # The supervisor's own lines are its log's; this command prints one line per event.
    with _interrupt_after(), contextlib.redirect_stdout(io.StringIO()):
        retried = retry_after(plan, job, run_dir, [], base, exclude=nodes, by="watch", cause=event.cause)
    excluded = ""
    if retried.new:
        excluded = next(
            (
                str(r.get("excluded") or "")
                for r in reversed(retry_records(run_dir))
                if str(r.get("job_id")) == retried.job_id
            ),
            "",
        )
    return Outcome(event, nodes, retried, excluded)


@contextlib.contextmanager
def _interrupt_after() -> Iterator[None]:
    """Ctrl-C waits for the retry in hand to be submitted, recorded and released (else a held job
    nobody records), then ends the watcher."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, _frame: asked.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if asked:
        raise KeyboardInterrupt


def watch_pass(host: Host, records: Sequence[RunRecord], base: Mapping[str, str]) -> list[Outcome]:
    """One pass over the runs: SLURM asked once, each event answered."""
    watched = [r for r in records if r.scheduler == "slurm" and not (r.tasks or r.links)]
    current = {record.run_dir: current_job(record) for record in watched}
    seen = ask_jobs(host, [job_id for job_id, _ in current.values()])
    return [answer(host, event, base) for event in events(watched, seen, current)]


def worth_watching(record: RunRecord) -> bool:
    """Whether ``--all`` asks SLURM about this run: not one that completed or was cancelled."""
    return not (record.path / CANCELLED_MARKER).exists() and exit_code_from_run_dir(Path(record.run_dir)) != 0

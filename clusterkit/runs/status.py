"""The state of a run, from the scheduler when it still knows the job (the controller, or for an
ended job SLURM's accounting database: ``sacct``) and from the run directory when it does not (a
cluster without accounting), plus the first failing rank's error."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterkit.runs.function_outcomes import function_failure
from clusterkit.runs.pending_reasons import pending_reason
from clusterkit.runs.record import RunRecord
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.function_jobs import RECORD_LAUNCHER
from clusterkit.spec.layout import (
    EXIT_CODE,
    HANG_RECORD,
    HOSTFILE,
    PREEMPTED_RECORD,
    PREFLIGHT_RESULT,
    RANK_LOGS,
    RESTARTS,
    TORCHRUN_ERROR_FILES,
    batch_log,
    mpirun_output,
    mpirun_rank_logs,
    node_dir,
    node_exit,
    node_log,
    node_number,
)
from clusterkit.supervisor.job_steps import label
from clusterkit.supervisor.run_files import STEPS_RECORD, json_objects, step_dir
from clusterkit.supervisor.stragglers import straggler

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # what a run file may hold that no terminal should get
PENDING, RUNNING, COMPLETED, FAILED, CANCELLED = "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"
TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, UNKNOWN = "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "UNKNOWN"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY})

# Every SLURM job state mapped onto ours; anything else is UNKNOWN.
_SLURM_STATES = {
    "PENDING": PENDING,
    "CONFIGURING": PENDING,
    "REQUEUED": PENDING,
    "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING,
    "RESV_DEL_HOLD": PENDING,
    "RUNNING": RUNNING,
    "COMPLETING": RUNNING,
    "RESIZING": RUNNING,
    "SIGNALING": RUNNING,
    "STAGE_OUT": RUNNING,
    "SUSPENDED": RUNNING,
    "STOPPED": RUNNING,
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "BOOT_FAIL": FAILED,
    "SPECIAL_EXIT": FAILED,
    "CANCELLED": CANCELLED,
    "REVOKED": CANCELLED,
    "DEADLINE": TIMEOUT,
    "TIMEOUT": TIMEOUT,
    "PREEMPTED": PREEMPTED,
    "NODE_FAIL": NODE_FAIL,
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
}


def normalize_slurm_state(raw: str) -> str:
    """``"CANCELLED by 0"`` → CANCELLED; unknown or empty → UNKNOWN."""
    word = raw.strip().split(" ")[0].rstrip("+").upper() if raw.strip() else ""
    return _SLURM_STATES.get(word, UNKNOWN)


@dataclass(frozen=True)
class JobStatus:
    state: str
    exit_code: int | None = None
    reason: str | None = None
    failure: str | None = None  # the first failing rank's error, when one failed
    # A rank persistently slower than the others (clusterkit.supervisor.stragglers): its figures and summary.
    straggler: dict | None = None
    # The launch's restarts on spare nodes in this job (restarts.jsonl): which nodes, when, why.
    restarts: list | None = None
    # A pending job's reason for a person (runs.pending_reasons): what it means and what to do.
    explanation: str | None = None
    never: bool = False  # pending for a reason that cannot pass: as submitted, it will never start
    # An ended SLURM job's times, as SLURM's accounting has them (ISO, the cluster's local time).
    submitted: str | None = None
    started: str | None = None
    ended: str | None = None
    elapsed_s: int | None = None
    # Why a job SLURM has forgotten is told by its run directory: the cluster has no accounting.
    accounting: str | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


def exit_code_from_run_dir(run_dir: Path) -> int | None:
    """The job's exit code, once its supervisor has written one."""
    try:
        return int(_text(run_dir / EXIT_CODE).strip())
    except ValueError:
        return None


def slurm_status(fields: Mapping[str, str] | None, exit_code: int | None) -> JobStatus:
    """The state from what SLURM says of the job (scontrol's field names: JobState, Reason,
    ExitCode, and for an ended job its times; none once it has forgotten the job and there is no
    accounting) and the run directory's exit code (the supervisor's, when it wrote one)."""
    if fields and "JobState" in fields:
        state = normalize_slurm_state(fields["JobState"])
        reason = fields.get("Reason") if fields.get("Reason") not in (None, "None", "(null)") else None
        if exit_code is None and fields.get("ExitCode", "").split(":")[0].isdigit():
            exit_code = int(fields["ExitCode"].split(":")[0]) if state in TERMINAL else None
        why = pending_reason(reason) if state == PENDING else None
        if why is not None:
            return JobStatus(state, exit_code, reason, explanation=why.line(), never=why.never)
        if state not in TERMINAL:  # scontrol's EndTime of a running job is its time limit, not an end
            return JobStatus(state, exit_code, reason)
        return JobStatus(state, exit_code, reason, **_times(fields))
    # SLURM has forgotten the job (MinJobAge passed) and there is no accounting: the run dir tells.
    note = fields.get("Accounting") if fields else None
    if exit_code is not None:
        return JobStatus(COMPLETED if exit_code == 0 else FAILED, exit_code, accounting=note)
    return JobStatus(UNKNOWN, reason="the scheduler no longer knows this job and it left no exit code", accounting=note)


def _times(fields: Mapping[str, str]) -> dict:
    """An ended job's times from SLURM's fields; "Unknown", "None" and anything else not a time are left out."""
    times = {}
    for name, field in (("submitted", "SubmitTime"), ("started", "StartTime"), ("ended", "EndTime")):
        try:
            times[name] = dt.datetime.fromisoformat(fields.get(field, "")).isoformat()
        except ValueError:
            continue
    elapsed = fields.get("ElapsedRaw", "")
    return {**times, "elapsed_s": int(elapsed)} if elapsed.isdigit() else times


def explained(record: RunRecord, status: JobStatus) -> JobStatus:
    """The scheduler's state with what the run directory adds: a preemption the runner recorded
    (the job ended on purpose, to be resumed), for a failure the first failing rank, and a straggler
    from the ranks' step times (while the job runs and after: a slow node may be why it failed)."""
    found = _explained(record, status)
    lagging = straggler(record.path, record.ranks_per_node, _hosts(record))
    if lagging:
        found = dataclasses.replace(found, straggler=lagging.to_json())
    restarts = _restarts(record.path)
    return dataclasses.replace(found, restarts=restarts) if restarts else found


def _restarts(run_dir: Path) -> list[dict] | None:
    """The launch's restarts on spares (the supervisor's restarts.jsonl, whole lines only), each
    with the time it lost: from the failure to the restarted launch's first progress."""
    found: dict[tuple, dict] = {}
    for line in _text(run_dir / RESTARTS).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        key = (entry.get("job_id"), entry.get("restart"))
        if isinstance(entry.get("dropped"), list):
            kept = ("restart", "job_id", "dropped", "why", "failed_at", "restarted_at")
            found[key] = {**{name: entry.get(name) for name in kept}, "lost_s": None}
        elif key in found and isinstance(entry.get("resumed_at"), (int, float)):
            failed = found[key]["failed_at"]
            if isinstance(failed, (int, float)):
                found[key]["lost_s"] = round(entry["resumed_at"] - failed, 1)
    return list(found.values()) or None


def restart_lines(restarts: list[dict]) -> list[str]:
    """One line per restart for a person: when, which nodes were dropped, why."""
    lines = []
    for restart in restarts:
        when = restart.get("restarted_at")
        at = time.strftime("%H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
        dropped = ", ".join(str(host) for host in restart["dropped"])
        lost = f"; {restart['lost_s']:g} s lost" if restart.get("lost_s") is not None else ""
        line = f"restart {restart.get('restart')} at {at} on a spare: dropped {dropped}: {restart.get('why')}{lost}"
        lines.append(_CONTROL.sub(" ", line))
    return lines


def _explained(record: RunRecord, status: JobStatus) -> JobStatus:
    stopped = _preempted_record(record.path)
    if stopped and status.state in (FAILED, COMPLETED):
        return dataclasses.replace(
            status,
            state=PREEMPTED,
            reason=f"stopped at step {stopped.get('step')}: {stopped.get('reason')}; "
            f"continue with: clusterkit submit --resume {record.run_dir}",
        )
    hang = _hang_record(record.path)
    if hang and status.state in (RUNNING, FAILED, TIMEOUT, CANCELLED, UNKNOWN):
        # The watchdog's verdict: which ranks were where (the failure is the hang, not a rank's error).
        reason = f"HUNG: {hang}" + (f"; {status.reason}" if status.reason else "")
        return dataclasses.replace(status, reason=reason)
    if status.state in (FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, UNKNOWN):
        failure = "; ".join(filter(None, (_failed_step(record.path), first_failure(record))))
        return dataclasses.replace(status, failure=failure or None)
    running = _last_step(record.path) if status.state == RUNNING and not status.reason else None
    if running is not None and "exit_code" not in running[1]:  # a job of several steps: which one runs
        return dataclasses.replace(status, reason=f"step {running[0]} running")
    return status


def _last_step(run_dir: Path) -> tuple[str, dict] | None:
    """A job of several steps: its last run of a step as ``steps.jsonl`` has it (its label, and the
    start record, or the end record once it ended)."""
    records = json_objects(_text(run_dir / STEPS_RECORD))
    last = records[-1] if records else None
    if last is None or not isinstance(last.get("trial"), int) or not isinstance(last.get("repeat"), int):
        return None  # none, or not the supervisor's line
    return _CONTROL.sub(" ", label(str(last.get("step")), last["trial"], last["repeat"])), last


def _failed_step(run_dir: Path) -> str | None:
    """The run of a step that ended the job (failed, or stopped to be requeued) and where its logs are."""
    found = _last_step(run_dir)
    if found is None or "exit_code" not in found[1] or (found[1]["exit_code"] == 0 and not found[1].get("interrupted")):
        return None
    name, last = found
    logs = _CONTROL.sub(" ", step_dir(str(last["step"]), last["trial"] if last["repeat"] > 1 else None))
    how = "was interrupted" if last.get("interrupted") else f"exited with {last['exit_code']}"
    return f"step {name} {how} (logs in {logs}/)"


def _hang_record(run_dir: Path) -> str | None:
    """What the watchdog found, as one line: why, and where the ranks were."""
    try:
        hang = json.loads(_text(run_dir / HANG_RECORD))
    except ValueError:
        return None
    if not isinstance(hang, dict):
        return None
    return _CONTROL.sub(" ", f"{hang.get('why')}: {hang.get('line')}")


def _preempted_record(run_dir: Path) -> dict | None:
    try:
        stopped = json.loads(_text(run_dir / PREEMPTED_RECORD))
    except ValueError:
        return None
    return stopped if isinstance(stopped, dict) else None


# The node agent's lines when it cannot start the program (clusterkit.supervisor.node).
_AGENT_REFUSAL = re.compile(r"^clusterkit: ((?:\{env:\w+\} in the |cannot start ).*)$", re.M)
_SUPERVISOR_REFUSAL = re.compile(r"^clusterkit: (\{env:\w+\} in the .*)$", re.M)  # an unset {env:NAME} it fills in
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\n(?P<block>(?:  .*\n?)+)")


def _failing_node(run_dir: Path) -> int | None:
    """The node whose launcher ended first with a non-zero code (each node records when it ended)."""
    ended = []
    for path in run_dir.glob(node_exit("*")):
        try:
            when, code = _text(path).split()
            if code != "0":
                ended.append((float(when), node_number(path.stem)))
        except ValueError:
            continue  # not a node's record (a damaged or stray file)
    return min(ended)[1] if ended else None


def _root_cause(record: RunRecord, node: int) -> str | None:
    """torchrun's own summary of the node's failed ranks ("Root Cause (first observed failure)")."""
    match = _ROOT_CAUSE.search(_tail(record.path / node_log(record.job_id, node, "err"), 65536))
    if not match:
        return None
    block = match.group("block")
    fields = dict(re.findall(r"^  (\w+)\s*: (.*)$", block, re.M))
    rank = fields.get("rank", "?").split()[0]
    # A traceback continues on indented lines; its last line is the exception itself.
    traceback = block.split("traceback :", 1)[1] if "traceback :" in block else ""
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    cause = lines[-1] if lines else ""
    if cause.startswith(("To enable traceback", "<N/A>")) or not cause:
        cause = f"exit code {fields.get('exitcode', '?').strip()}"
    return f"rank {rank} (node {node}{_hostname(record, node)}): {cause}"


def _hosts(record: RunRecord) -> list[str]:
    """Each node's host name, by node number (the supervisor's hostfile)."""
    return [line.split()[0] for line in _text(record.path / HOSTFILE).splitlines() if line.strip()]


def _hostname(record: RunRecord, node: int) -> str:
    hosts = _hosts(record)
    return f", {hosts[node]}" if node < len(hosts) else ""


def first_failure(record: RunRecord) -> str | None:
    """The first failure: the node whose launcher failed first and torchrun's root cause there;
    otherwise the earliest error a rank reported: torchelastic's error.json files (rank and message),
    ordered by when they were written — the ranks that fail only because a peer died write theirs
    later, and torchelastic's own timestamp has one-second resolution, too coarse to tell — then the
    last line of the earliest rank log that holds a traceback."""
    if record.launcher == RECORD_LAUNCHER:  # a function's job: submitit's result files say it
        return function_failure(record)
    run_dir = record.path
    refused = _slow_preflight(run_dir)
    if refused:
        return refused
    node = _failing_node(run_dir)
    if node is not None:
        refused = _AGENT_REFUSAL.findall(_tail(record.path / node_log(record.job_id, node, "err")))
        if refused:  # the node agent did not start the program: its line says why
            return f"node {node}{_hostname(record, node)}: {refused[-1]}"
    else:  # no node started: the supervisor's own line, in the batch shell's log
        refused = _SUPERVISOR_REFUSAL.findall(_tail(record.path / batch_log(record.job_id, "out")))
        if refused:
            return refused[-1]
    if node is not None and record.launcher == "torchrun":
        cause = _root_cause(record, node)
        if cause:
            return cause
    reports = []
    for error_file in run_dir.glob(f"{node_dir('*')}/{TORCHRUN_ERROR_FILES}"):
        try:
            message = json.loads(_text(error_file))["message"]
            node = node_number(error_file.parts[-5])  # ranks/node<N>/<run id>/attempt_<k>/<local rank>/error.json
            rank = node * record.ranks_per_node + int(error_file.parts[-2])
            written = error_file.stat().st_mtime_ns
        except (OSError, ValueError, KeyError, TypeError):
            continue  # damaged, or not torchelastic's
        text = str(message.get("message", "")) if isinstance(message, dict) else str(message)
        reports.append((written, rank, text.strip().splitlines()[-1] if text.strip() else "error"))
    if reports:
        _, rank, text = min(reports)
        return f"rank {rank} (node {rank // record.ranks_per_node}{_hostname(record, rank // record.ranks_per_node)}): {text}"
    rank_logs = [
        *run_dir.glob(f"{node_dir('*')}/{RANK_LOGS}"),
        *run_dir.glob(f"{mpirun_output('*')}/{mpirun_rank_logs('*')}"),
    ]
    logs = sorted(
        (p for p in rank_logs if "Traceback" in _tail(p)),
        key=lambda p: p.stat().st_mtime,
    )
    if logs:
        lines = [line for line in _tail(logs[0]).splitlines() if line.strip()]
        return f"{logs[0].relative_to(run_dir)}: {lines[-1] if lines else 'traceback'}"
    return None


def _slow_preflight(run_dir: Path) -> str | None:
    """Why a job stopped before training when its preflight found slow nodes (on_slow: fail)."""
    try:
        result = json.loads(_text(run_dir / PREFLIGHT_RESULT))
        if not result.get("slow_nodes") or result.get("on_slow") != "fail":
            return None
        slow = [n for n in result["per_node"] if n["node"] in result["slow_nodes"]]
        listed = ", ".join(f"node {n['node']} ({n['host']}, {n['busbw_gbps']:.3g} GB/s)" for n in slow)
        return (
            f"preflight: {listed} below {result['slow_fraction']:.0%} of the median node's all-reduce bus "
            f"bandwidth; not trained (preflight.on_slow: fail)"
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no preflight, or a damaged result


def _text(path: Path) -> str:
    """A small file the job writes, as text; "" where it is missing, unreadable, no regular file or
    larger than any the job writes."""
    try:
        return read_bounded(path, CONFIG_LIMIT, "a run file").decode("utf-8", "replace")
    except (OSError, InputFileError):
        return ""


def _tail(path: Path, size: int = 16384) -> str:
    try:
        return read_bounded(path, size, "a log", tail=True).decode("utf-8", "replace")
    except (OSError, InputFileError):
        return ""

"""``clusterkit top``'s rows: for each run, its state, step, samples/s, ETA, time since its last sign
of progress, and flags (HUNG, STRAGGLER), from what its run directory holds (read by
:func:`read_run_files`, or over SSH by the command) and the scheduler's state.

Everything here is read from files the job, its script or the watchdog write, so nothing is
trusted: metrics.jsonl is read from its end and at most :data:`METRICS_TAIL` bytes of it (a line
cut short there is left out), a value that is not a finite number (NaN, a string, a bool) counts
as not logged, hang.json is read at most :data:`HANG_LIMIT` bytes and anything but
``{"line": "<text>"}`` reads as "hang record unreadable", and each text shown in the table passes
through :func:`clusterkit.errors.printable` (:func:`cells`), so no escape sequence reaches the
terminal; ``--json`` escapes it as JSON does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterkit.errors import printable
from clusterkit.runs.curves import finite_number
from clusterkit.runs.record import RunRecord, metric_records
from clusterkit.runs.status import TERMINAL, JobStatus
from clusterkit.spec.bounded_read import InputFileError, read_bounded
from clusterkit.spec.layout import HANG_RECORD, HEARTBEAT, METRICS

METRICS_TAIL = 64 * 1024  # the end of metrics.jsonl read each refresh: many log lines, never the whole file
HANG_LIMIT = 64 * 1024  # a hang record is a few lines; past this it is no hang record
RECENT = 5  # the log lines the rate is taken over
HUNG, STRAGGLER = "HUNG", "STRAGGLER"
UNREADABLE_HANG = "hang record unreadable"
NOT_KNOWN = "–"  # a value top cannot tell yet (no step logged, no max_steps, a rate of one line)


@dataclass(frozen=True)
class RunFiles:
    """What top reads of one run directory at a refresh, on the machine that holds it."""

    metrics: bytes  # the last METRICS_TAIL bytes of metrics.jsonl, starting at a whole line (b"": none)
    metrics_mtime: float | None
    heartbeat_mtime: float | None
    hang: bytes | None  # hang.json's first HANG_LIMIT + 1 bytes (None: no hang record)
    now: float  # that machine's clock, for the time since the last progress


@dataclass(frozen=True)
class Row:
    """One run's line of the table (and its ``--json`` object: docs/json.md)."""

    job_id: str
    name: str
    state: str
    step: int | None
    max_steps: int | None
    samples_per_s: float | None
    eta_s: float | None
    idle_s: float | None  # seconds since the last metrics line or heartbeat
    flags: tuple[str, ...]
    hang: str | None  # the watchdog's summary (or UNREADABLE_HANG) when HUNG
    straggler: str | None
    run_dir: str


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _hang_bytes(path: Path) -> bytes | None:
    """hang.json's bytes, or None where there is none; one that cannot be read as a regular file of
    a sane size still says the watchdog wrote something (b"": unreadable)."""
    try:
        return read_bounded(path, HANG_LIMIT, "a hang record")
    except FileNotFoundError:
        return None
    except (OSError, InputFileError):
        return b""


def read_run_files(run_dir: Path, now: float) -> RunFiles:
    """A run directory on this machine, read as top reads it (bounded, never blocking on a FIFO)."""
    metrics_path = run_dir / METRICS
    try:
        data = read_bounded(metrics_path, METRICS_TAIL, "the run's metrics", tail=True)
        if metrics_path.stat().st_size > len(data):
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""  # the first line is cut short
    except (OSError, InputFileError):
        data = b""
    return RunFiles(data, _mtime(metrics_path), _mtime(run_dir / HEARTBEAT), _hang_bytes(run_dir / HANG_RECORD), now)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def hang_summary(data: bytes | None) -> str | None:
    """The watchdog's one-line summary from hang.json (``{"line": "..."}``), shown inert; any other
    content: :data:`UNREADABLE_HANG`; no record: None. Shown through :func:`cells`, inert."""
    if data is None:
        return None
    try:
        line = json.loads(data.decode("utf-8")).get("line") if len(data) <= HANG_LIMIT else None
    except (ValueError, AttributeError):
        line = None
    if not isinstance(line, str) or not line.strip():
        return UNREADABLE_HANG
    return line.strip()[:300]


def _rate(logs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """samples/s (the mean of the recent lines' values) and steps/s (from the recent lines' times
    and steps; none from fewer than two lines)."""
    recent = logs[-RECENT:]
    speeds = [s for s in (finite_number(m.get("samples_per_s")) for m in recent) if s is not None and s >= 0]
    points = [
        (t, s)
        for m in recent
        if (t := finite_number(m.get("time"))) is not None and (s := _whole(m.get("step"))) is not None
    ]
    steps_per_s = None
    if len(points) >= 2 and points[-1][0] > points[0][0] and points[-1][1] > points[0][1]:
        steps_per_s = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
    return (sum(speeds) / len(speeds) if speeds else None), steps_per_s


def row_of(record: RunRecord, status: JobStatus, files: RunFiles, name: str | None = None) -> Row:
    """The run's row from its status and files; ``name`` replaces the record's (a sweep point's values)."""
    records = metric_records(files.metrics.decode("utf-8", "replace"))
    steps = [s for s in (_whole(m.get("step")) for m in records) if s is not None]
    max_steps = next((m for m in (_whole(m.get("max_steps")) for m in reversed(records)) if m), None)
    samples_per_s, steps_per_s = _rate([m for m in records if m.get("event") == "log"])
    step = steps[-1] if steps else None
    eta_s = None
    if status.state not in TERMINAL and step is not None and max_steps and steps_per_s:
        eta_s = max(0, max_steps - step) / steps_per_s
    progress = [t for t in (files.metrics_mtime, files.heartbeat_mtime) if t is not None]
    hang = hang_summary(files.hang)
    # The status names a rank persistently slower than the others (clusterkit.supervisor.stragglers).
    straggler = (status.straggler or {}).get("summary")
    flags = tuple(flag for flag, note in ((HUNG, hang), (STRAGGLER, straggler)) if note is not None)
    return Row(
        job_id=record.job_id,
        name=name if name is not None else record.name,
        state=status.state,
        step=step,
        max_steps=max_steps,
        samples_per_s=samples_per_s,
        eta_s=eta_s,
        idle_s=max(0.0, files.now - max(progress)) if progress else None,
        flags=flags,
        hang=hang,
        straggler=straggler,
        run_dir=record.run_dir,
    )


def duration(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``2d04h``; unknown: ``–``."""
    if seconds is None:
        return NOT_KNOWN
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


HEADER = ("JOB", "NAME", "STATE", "STEP", "SAMPLES/S", "ETA", "LAST PROGRESS", "FLAGS")


def cells(row: Row) -> tuple[str, ...]:
    """The row as the table's text cells (HEADER's order), each inert."""
    step = NOT_KNOWN if row.step is None else str(row.step) + (f"/{row.max_steps}" if row.max_steps else "")
    flags = " ".join([*row.flags, *(f"({note})" for note in (row.hang, row.straggler) if note)])
    return tuple(
        map(
            printable,
            (
                row.job_id,
                row.name,
                row.state,
                step,
                NOT_KNOWN if row.samples_per_s is None else f"{row.samples_per_s:.1f}",
                duration(row.eta_s),
                NOT_KNOWN if row.idle_s is None else f"{duration(row.idle_s)} ago",
                flags,
            ),
        )
    )


def row_json(row: Row) -> dict[str, Any]:
    """``clusterkit top --json``: one object per run per refresh (docs/json.md); its text as it is,
    which JSON escapes (a control character is written ``\\u001b``)."""
    return {
        "job_id": row.job_id,
        "name": row.name,
        "state": row.state,
        "step": row.step,
        "max_steps": row.max_steps,
        "samples_per_s": row.samples_per_s,
        "eta_s": row.eta_s,
        "last_progress_s": row.idle_s,
        "flags": list(row.flags),
        "hang": row.hang,
        "straggler": row.straggler,
        "run_dir": row.run_dir,
    }

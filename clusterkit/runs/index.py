"""Every run submitted from this machine, by job id, so that ``status``, ``logs``, ``cancel`` and
``ls`` find a run from any directory: ``$XDG_STATE_HOME/clusterkit/runs.jsonl``
(``~/.local/state/clusterkit/runs.jsonl``). An entry points at the directory holding the run's
record on this machine (an SSH run's local record dir); the record stays the truth.

Why JSON lines and not sqlite3: a damaged line (a write cut short, a disk that filled) loses that
one run and is skipped, where a damaged database loses every run or answers "database is locked"
while a submit waits; an append is one ``write`` under an ``flock``, so two submits at once each
add a whole line; the file is plain text a user can read and mend; and reading it costs the
``json`` module, which completion can afford. The index is a convenience: it never fails a
submit (a read-only or full state dir is a warning), and a run directory deleted since is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import msgspec

from clusterkit.errors import BadRunRecord
from clusterkit.runs.record import JobId, RunRecord, read_record
from clusterkit.spec.bounded_read import InputFileError, MiB, read_bounded
from clusterkit.spec.layout import RUN_RECORD

INDEX_NAME = "runs.jsonl"
# Past this size an add rewrites the file with only the runs still on disk, the newest KEEP of them.
COMPACT_BYTES = 1 << 20
KEEP = 5000
# Far more than KEEP runs' lines: an index past it is no index (a device, or a file filled by mistake).
INDEX_LIMIT = 64 * MiB
LOCK_WAIT_S = 5  # an add gives up (with a warning) after waiting this long for the lock


@dataclass(frozen=True)
class Entry:
    job_id: JobId
    name: str
    scheduler: str
    record_dir: str  # absolute: where run.json is on this machine
    submitted_at: float


def _warn(message: str) -> None:
    print(f"clusterkit: warning: {message}", file=sys.stderr)


def index_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or ""
    # XDG: a relative $XDG_STATE_HOME is invalid and is ignored.
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "clusterkit" / INDEX_NAME


def add_run(record: RunRecord, record_dir: Path, warn: Callable[[str], None] = _warn) -> None:
    """Add a submitted run (a job array's record covers its tasks). Never raises: the job is
    queued whatever happens here, so a failure is a warning."""
    entry = Entry(record.job_id, record.name, record.scheduler, str(record_dir.absolute()), record.submitted_at)
    line = json.dumps(asdict(entry)) + "\n"
    path = index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size and os.pread(handle.fileno(), 1, size - 1) != b"\n":
                line = "\n" + line  # after a line cut short: that one stays damaged, this one whole
            os.write(handle.fileno(), line.encode())
            if size > COMPACT_BYTES:
                _compact(path)
    except (OSError, InputFileError) as exc:
        why = exc.problem if isinstance(exc, InputFileError) else exc.strerror
        warn(
            f"{path}: cannot add job {record.job_id} to the run index ({why}); "
            f"clusterkit status finds it only with --runs-dir"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[IO[bytes]]:
    """The index opened for appending under an exclusive lock; opened again when a compaction
    replaced the file while this process waited (it would write into the old one)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        with open(path, "a+b") as handle:  # read too: the last byte is checked
            while not _try_lock(handle):
                if time.monotonic() > deadline:  # a hung holder must not hold the submit up
                    raise TimeoutError(errno.EWOULDBLOCK, f"locked by another process for {LOCK_WAIT_S} s")
                time.sleep(0.01)
            if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                yield handle
                return


def _try_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _compact(path: Path) -> None:
    """Rewrite the index (its lock held) with the newest KEEP runs still on disk."""
    entries = [e for e in _entries(path, lambda _: None) if (Path(e.record_dir) / RUN_RECORD).is_file()][:KEEP]
    staging = path.with_name(f".{INDEX_NAME}.{os.getpid()}")
    try:
        staging.write_text("".join(json.dumps(asdict(e)) + "\n" for e in reversed(entries)), encoding="utf-8")
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def _entries(path: Path, warn: Callable[[str], None]) -> list[Entry]:
    """The index's entries, newest first; damaged lines skipped with one warning."""
    try:
        data = read_bounded(path, INDEX_LIMIT, "the run index")
    except FileNotFoundError:
        return []
    except OSError as exc:
        warn(f"{path}: cannot read the run index ({exc.strerror}); ignoring it")
        return []
    entries, damaged = [], 0
    for line in data.splitlines():
        try:
            entry = msgspec.json.decode(line, type=Entry)
        except msgspec.DecodeError:  # cut short, not an object, a field missing or of the wrong type
            damaged += bool(line.strip())
            continue
        if os.path.isabs(entry.record_dir):  # a relative one would mean wherever the reader stands
            entries.append(entry)
        else:
            damaged += 1
    if damaged:
        warn(f"{path}: skipped {damaged} damaged line{'s' * (damaged > 1)} of the run index")
    return sorted(entries, key=lambda e: e.submitted_at, reverse=True)


def indexed_runs(warn: Callable[[str], None] = _warn) -> Iterator[RunRecord]:
    """The runs of the index whose records are still on disk, newest first, each once."""
    seen = set()
    for entry in _entries(index_path(), warn):
        if entry.record_dir in seen or not (Path(entry.record_dir) / RUN_RECORD).is_file():
            continue  # deleted since: not an error
        seen.add(entry.record_dir)
        try:
            yield read_record(Path(entry.record_dir))
        except BadRunRecord as exc:
            warn(f"skipping {exc.args[0]}")


def find_indexed(job_id: str, warn: Callable[[str], None] = _warn) -> RunRecord | None:
    """The newest indexed run with this job id (its record says so), or None."""
    for entry in _entries(index_path(), warn):
        if entry.job_id == job_id and (Path(entry.record_dir) / RUN_RECORD).is_file():
            try:
                record = read_record(Path(entry.record_dir))
            except BadRunRecord as exc:
                warn(f"skipping {exc.args[0]}")
                continue
            if record.job_id == job_id:
                return record
    return None


def indexed_job_ids(limit: int = 200) -> list[str]:
    """Job ids of the newest runs still on disk, for completion: no record is parsed."""
    entries = _entries(index_path(), lambda _: None)
    return [e.job_id for e in entries[:limit] if (Path(e.record_dir) / RUN_RECORD).is_file()]

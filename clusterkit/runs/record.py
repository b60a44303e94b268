"""Run directories and their records: ``<runs_dir>/<name>/<job id>/run.json``.

``status``, ``logs``, ``cancel`` and ``ls`` work from these records, so they need no accounting
database (``sacct``) and also describe runs of the local executor.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from clusterkit.errors import BadRunRecord, RunNotFound
from clusterkit.spec.bounded_read import RECORD_LIMIT, InputFileError, read_bounded
from clusterkit.spec.layout import RUN_RECORD
from clusterkit.spec.profile import Login
from clusterkit.supervisor.run_files import json_objects

# A job id names files and directories and is matched in globs: one plain word, no path or pattern.
JobId = Annotated[str, msgspec.Meta(pattern=r"^[0-9A-Za-z_.-]+$")]
Positive = Annotated[int, msgspec.Meta(ge=1)]


@dataclass(frozen=True)
class TrackedRun:
    """The tracked run a job reports to (spec.tracking), fixed at submit: a requeue or a
    ``submit --resume`` continues the same one."""

    tracker: Literal["wandb", "mlflow", "tensorboard"]
    run_id: str
    dir: str  # the tracker's folder, in the first run directory of a resumed run
    offline: bool = False


@dataclass(frozen=True)
class RunRecord:
    job_id: JobId
    name: str
    scheduler: Literal["slurm", "local", "ssh"]  # ssh: submitted on a login node; run_dir is there
    run_dir: str
    recipe: str
    submitted_at: float
    nodes: Positive  # training's
    ranks_per_node: Positive
    launcher: str
    pid: Positive | None = None  # the local executor's batch process
    spare_nodes: int = 0  # allocated beside training's nodes (resources.spare_nodes)
    overrides: tuple[str, ...] = ()  # the --set values it was submitted with (for --resume)
    login: dict[str, Any] | None = None  # ssh: the profile's login settings, to reach the run again
    # A job array's record: its task indices; each task has a record of its own, job id
    # <array id>_<index>, in <run_dir>/<index>/.
    tasks: tuple[int, ...] = ()
    # A chain's record: its number of links (array tasks 0..links-1, one at a time, all in run_dir).
    links: int = 0
    cluster: str | None = None  # the cluster profile's name (records from before it was kept: None)
    tracking: TrackedRun | None = None
    # The code snapshot (snapshot:) the job runs from, in <run_dir>/code: the folder it was copied from
    # on the submitting machine, its git commit, and whether the copy differs from that commit.
    code_from: str | None = None
    code_commit: str | None = None
    code_dirty: bool | None = None

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def write(self, directory: Path | None = None) -> None:
        """Into the run directory, or for an ssh run into ``directory`` on this machine."""
        target = (directory or self.path) / RUN_RECORD
        staging = target.with_suffix(".tmp")
        staging.write_text(self.to_json(), encoding="utf-8")
        os.replace(staging, target)


def metric_records(text: str) -> list[dict[str, Any]]:
    """The records of metrics.jsonl text; a line that is not a JSON object (one cut short when its
    rank was killed mid-write) is left out rather than failing the reader."""
    return json_objects(text)


def read_record(run_dir: Path) -> RunRecord:
    path = run_dir / RUN_RECORD
    try:
        text = read_bounded(path, RECORD_LIMIT, "a run record")
    except OSError as exc:
        raise BadRunRecord(f"{path}: cannot read the run record: {exc.strerror}") from None
    except InputFileError as exc:
        raise BadRunRecord(str(exc)) from None
    return parse_record(text, str(path))


def parse_record(text: str | bytes, source: str = "run record") -> RunRecord:
    """The record, with every field's type checked (a field of the wrong type would fail later,
    far from the file that holds it)."""
    try:
        record = msgspec.json.decode(text, type=RunRecord)
    except msgspec.DecodeError as exc:
        raise BadRunRecord(f"{source}: not a clusterkit run record: {exc}") from None
    if record.login is not None:  # kept as the mapping it is; checked as a profile's login: is
        try:
            msgspec.convert(record.login, Login)
        except msgspec.ValidationError as exc:
            raise BadRunRecord(f"{source}: not a clusterkit run record: login: {exc}") from None
    return record


def _warn(message: str) -> None:
    print(f"clusterkit: {message}", file=sys.stderr)


def list_runs(runs_dir: Path, warn: Callable[[str], None] = _warn) -> list[RunRecord]:
    """Every run under ``runs_dir`` (``<name>/<id>/run.json``), newest first; a record that cannot
    be read is skipped with a warning, so one damaged run does not hide the others."""
    records = []
    for record_path in runs_dir.glob(f"*/*/{RUN_RECORD}"):
        try:
            records.append(read_record(record_path.parent))
        except BadRunRecord as exc:
            warn(f"skipping {exc.args[0]}")
    return sorted(records, key=lambda r: r.submitted_at, reverse=True)


def find_run(reference: str, runs_dir: Path) -> RunRecord:
    """A run by its run directory path, or by job id: the run directory ``<name>/<job id>`` (or
    ``<job id>@<host>`` for a run on a login node) under ``runs_dir``, newest first."""
    as_path = Path(reference)
    if (as_path / RUN_RECORD).is_file():
        return read_record(as_path)
    candidates = []
    if "/" not in reference and reference not in (".", ".."):
        word = glob.escape(reference)
        candidates = [*runs_dir.glob(f"*/{word}/{RUN_RECORD}"), *runs_dir.glob(f"*/{word}@*/{RUN_RECORD}")]
        # A job array's task, <array id>_<index>: its own record in <array run dir>/<index>/.
        array_id, _, index = reference.rpartition("_")
        if array_id and index.isdigit():
            words = glob.escape(array_id), glob.escape(index)
            candidates += [
                *runs_dir.glob(f"*/{words[0]}/{words[1]}/{RUN_RECORD}"),
                *runs_dir.glob(f"*/{words[0]}@*/{words[1]}/{RUN_RECORD}"),
            ]
    matches = [r for r in (read_record(path.parent) for path in candidates) if r.job_id == reference]
    if not matches:
        raise RunNotFound(f"no run with job id {reference} under {runs_dir} (give the run directory, or --runs-dir)")
    return max(matches, key=lambda r: r.submitted_at)

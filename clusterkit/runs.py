"""Run directories and their records: ``<runs_dir>/<name>/<job id>/run.json``.

``status``, ``logs``, ``cancel`` and ``ls`` work from these records, so they need no accounting
database (``sacct``) and also describe runs of the local executor.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECORD = "run.json"
EXIT_CODE = "exit_code"  # written by the batch script when its launchers have exited


@dataclass(frozen=True)
class RunRecord:
    job_id: str
    name: str
    scheduler: str  # "slurm", "local" or "ssh" (submitted on a login node; run_dir is there)
    run_dir: str
    recipe: str
    submitted_at: float
    nodes: int
    ranks_per_node: int
    launcher: str
    pid: int | None = None  # the local executor's batch process
    overrides: tuple[str, ...] = ()  # the --set values it was submitted with (for --resume)
    login: dict[str, Any] | None = None  # ssh: the profile's login settings, to reach the run again

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def write(self, directory: Path | None = None) -> None:
        """Into the run directory, or for an ssh run into ``directory`` on this machine."""
        target = (directory or self.path) / RECORD
        staging = target.with_suffix(".tmp")
        staging.write_text(self.to_json(), encoding="utf-8")
        os.replace(staging, target)


def read_record(run_dir: Path) -> RunRecord:
    return parse_record((run_dir / RECORD).read_text(encoding="utf-8"))


def parse_record(text: str) -> RunRecord:
    data = json.loads(text)
    data["overrides"] = tuple(data.get("overrides", ()))
    return RunRecord(**data)


def list_runs(runs_dir: Path) -> list[RunRecord]:
    """Every run under ``runs_dir`` (``<name>/<id>/run.json``), newest first."""
    records = []
    for record_path in runs_dir.glob(f"*/*/{RECORD}"):
        try:
            records.append(read_record(record_path.parent))
        except (OSError, ValueError, TypeError):
            continue  # a run dir being written, or not ours
    return sorted(records, key=lambda r: r.submitted_at, reverse=True)


class RunNotFound(LookupError):
    pass


def find_run(reference: str, runs_dir: Path) -> RunRecord:
    """A run by its run directory path, or by job id (searched under ``runs_dir``)."""
    as_path = Path(reference)
    if (as_path / RECORD).is_file():
        return read_record(as_path)
    matches = [r for r in list_runs(runs_dir) if r.job_id == reference]
    if not matches:
        raise RunNotFound(f"no run with job id {reference} under {runs_dir} (give the run directory, or --runs-dir)")
    return matches[0]

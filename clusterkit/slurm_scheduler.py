"""The SLURM adapter: submitit submits and tracks our rendered script verbatim."""

from __future__ import annotations

import os
import time
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError

from clusterkit import proc
from clusterkit.runs import RunRecord
from clusterkit.submission import SubmitRequest, write_run_files


class SubmissionError(RuntimeError):
    """sbatch refused the job (distinct from a job that was accepted and then failed)."""


class RenderedScriptExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor whose submission file is clusterkit's rendered script, byte for
    byte, submitted held (``--hold``) so the run directory exists before the job can start."""

    def __init__(self, folder: Path, script: str):
        super().__init__(folder=folder)
        self._script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", "--hold", str(submission_file_path)]


def submit(request: SubmitRequest) -> RunRecord:
    request.runs_root.mkdir(parents=True, exist_ok=True)
    executor = RenderedScriptExecutor(request.runs_root / "%j", request.script)
    try:
        job = executor._submit_command("")  # our script is the whole job; there is no pickled callable
    except FailedJobError as exc:
        raise SubmissionError(f"sbatch refused the job: {exc}") from None
    try:
        run_dir = job.paths.folder
        # submitit leaves a symlink to the moved submission file; remove ours only (other submits
        # may be writing theirs at the same moment).
        for leftover in request.runs_root.glob(".submission_file_*.sh"):
            if leftover.is_symlink() and Path(os.readlink(leftover)) == job.paths.submission_file:
                leftover.unlink(missing_ok=True)
        write_run_files(request, run_dir)
        record = RunRecord(
            job_id=job.job_id, name=request.name, scheduler="slurm", run_dir=str(run_dir),
            recipe=request.recipe, submitted_at=time.time(), nodes=request.nodes,
            ranks_per_node=request.ranks_per_node, launcher=request.launcher, overrides=request.overrides,
        )
        record.write()
        proc.run(["scontrol", "release", job.job_id])
    except BaseException:
        job.cancel(check=False)  # never leave a half-prepared job in the queue
        raise
    return record


def cancel(record: RunRecord) -> None:
    submitit.SlurmJob(folder=record.path.parent / "%j", job_id=record.job_id).cancel(check=True)

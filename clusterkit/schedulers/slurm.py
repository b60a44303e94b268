"""The SLURM adapter: submitit submits and tracks our rendered script verbatim."""

from __future__ import annotations

import contextlib
import io
import shutil
import time
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError

from clusterkit.schedulers import proc
from clusterkit.errors import SubmitError
from clusterkit.runs.layout import pending_submission_file
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers.api import SubmitRequest, creating_run_dir, write_run_files


class RenderedScriptExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor whose submission file is clusterkit's rendered script, byte for
    byte, submitted held (``--hold``) so the run directory exists before the job can start. It
    remembers the submission file's uid and the job id sbatch gave, to undo a failed submit."""

    def __init__(self, folder: Path, script: str):
        super().__init__(folder=folder)
        self._script = script
        self.submission_uid: str | None = None
        self.queued_job_id: str | None = None

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        self.submission_uid = uid
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", "--hold", str(submission_file_path)]

    def _get_job_id_from_submission_command(self, string: bytes | str) -> str:  # type: ignore[override]
        self.queued_job_id = submitit.SlurmExecutor._get_job_id_from_submission_command(string)
        return self.queued_job_id


def _sbatch(executor: RenderedScriptExecutor, runs_root: Path) -> submitit.Job:
    if not shutil.which("sbatch"):
        raise SubmitError("sbatch: command not found")
    try:
        with creating_run_dir(runs_root), contextlib.redirect_stderr(io.StringIO()):  # submitit prints
            return executor._submit_command("")  # sbatch's error too; the exception below says it once
    except FailedJobError as exc:
        said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise SubmitError(f"sbatch refused the job: {said}") from None


def _undo(executor: RenderedScriptExecutor, runs_root: Path) -> None:
    """After a failed submit: no held job in the queue, no submission file, no run directory."""
    if executor.queued_job_id:
        proc.run(["scancel", executor.queued_job_id], check=False)
        shutil.rmtree(runs_root / executor.queued_job_id, ignore_errors=True)
    if executor.submission_uid:
        (runs_root / pending_submission_file(executor.submission_uid)).unlink(missing_ok=True)


def submit(request: SubmitRequest) -> RunRecord:
    runs_root = Path(request.runs_root)
    with creating_run_dir(runs_root):
        runs_root.mkdir(parents=True, exist_ok=True)
    executor = RenderedScriptExecutor(runs_root / "%j", request.script)
    try:
        job = _sbatch(executor, runs_root)
        run_dir = job.paths.folder
        with creating_run_dir(run_dir):
            # submitit leaves a symlink to the moved submission file.
            (runs_root / pending_submission_file(executor.submission_uid)).unlink(missing_ok=True)
            write_run_files(request, run_dir)
            record = RunRecord(
                job_id=job.job_id, name=request.name, scheduler="slurm", run_dir=str(run_dir),
                recipe=request.recipe, submitted_at=time.time(), nodes=request.nodes,
                ranks_per_node=request.ranks_per_node, launcher=request.launcher, overrides=request.overrides,
            )
            record.write()
        proc.run(["scontrol", "release", job.job_id])
    except BaseException:
        _undo(executor, runs_root)  # never a half-prepared job in the queue or a partial run directory
        raise
    return record


def cancel(record: RunRecord) -> None:
    submitit.SlurmJob(folder=record.path.parent / "%j", job_id=record.job_id).cancel(check=True)

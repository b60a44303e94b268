"""``clusterkit sync RUN``: upload a run tracked offline (``tracking.offline``) from the login
node, through the tracker's own tool. What each tracker allows:

- wandb: ``wandb sync`` of the run's offline-run folders (one per start of the job: the first
  submit, each requeue, each --resume), which wandb uploads in start order into the one run id.
- mlflow: nothing. mlflow's CLI has no command that copies a file-store run to a tracking server
  (``mlflow migrate-filestore`` only converts the store to a local SQLite database); sync says
  where the store is and how to open it (``mlflow ui --backend-store-uri``).
- tensorboard: nothing to upload: its event files are local; sync says where they are.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from clusterkit.errors import ExternalError, MissingPackage, UsageError
from clusterkit.runs.record import RunRecord
from clusterkit.spec import layout


def wandb_offline_runs(tracking_dir: Path, run_id: str) -> list[Path]:
    """The offline-run-<time>-<id> folders wandb wrote for ``run_id``, oldest first (latest-run,
    wandb's link to the newest, is left out: it would be synced twice)."""
    folder = tracking_dir / layout.WANDB_OFFLINE_DIR
    return sorted(p for p in folder.glob(f"offline-run-*-{run_id}") if p.is_dir() and not p.is_symlink())


def sync_argv(record: RunRecord, dry_run: bool = False) -> list[str]:
    """The command that uploads the run, as an argv list (no shell); UsageError for a run that
    has nothing to upload, saying why."""
    where = record.run_dir
    tracking = record.tracking
    if tracking is None:
        raise UsageError(f"{where}: not tracked (tracking: none): nothing to sync")
    if record.scheduler == "ssh":
        raise UsageError(f"{where}: the run's tracking files are on the login node; run clusterkit sync there")
    store = Path(tracking.dir)
    if tracking.tracker == "tensorboard":
        raise UsageError(
            f"{where}: tensorboard writes local event files only, nothing to upload: "
            f"tensorboard --logdir {store / layout.TENSORBOARD_DIR}"
        )
    if not tracking.offline:
        raise UsageError(
            f"{where}: tracked online (tracking.offline is false): it reported to {tracking.tracker} "
            "as it ran; nothing to sync"
        )
    if tracking.tracker == "mlflow":
        raise UsageError(
            f"{where}: mlflow has no command that uploads a file-store run to a tracking server; "
            f"the run is in the file store file:{store / layout.MLFLOW_STORE} "
            f"(mlflow ui --backend-store-uri file:{store / layout.MLFLOW_STORE})"
        )
    runs = wandb_offline_runs(store, tracking.run_id)
    if not runs:
        raise UsageError(
            f"{where}: no offline wandb run {tracking.run_id} in {store / layout.WANDB_OFFLINE_DIR} "
            "(has the job started?)"
        )
    return ["wandb", "sync", *(["--dry-run"] if dry_run else []), *map(str, runs)]


def run_sync(argv: list[str]) -> None:
    """Run the tracker's own sync; its output goes to ours."""
    try:
        done = subprocess.run(argv, check=False)
    except FileNotFoundError:
        raise MissingPackage(f"{argv[0]} is not installed here: pip install 'clusterkit[tracking]'") from None
    if done.returncode != 0:
        raise ExternalError(f"{argv[0]} sync failed (exit {done.returncode})")

"""In the job: the tracked run of ``tracking:`` (spec.tracking_env set the environment it reads).

wandb and tensorboard continue a run from the environment alone (WANDB_RUN_ID with
WANDB_RESUME=allow; TENSORBOARD_LOGGING_DIR). mlflow chooses its own run ids and resumes only a
run that exists (MLFLOW_RUN_ID), so rank 0 finds the run tagged with clusterkit's id, or creates it
on the first start, before the Trainer's MLflowCallback starts it. A script task's own code can
call :func:`mlflow_run_id` for the same run."""

from __future__ import annotations

import os

# The mlflow tag that holds clusterkit's run id (CLUSTERKIT_TRACKING_RUN_ID).
MLFLOW_TAG = "clusterkit.run_id"


def mlflow_run_id() -> str:
    """The id of the mlflow run of this job's tracked run (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME
    and CLUSTERKIT_TRACKING_RUN_ID from the job's environment), created on the first call of the run."""
    from mlflow.tracking import MlflowClient

    ours = os.environ["CLUSTERKIT_TRACKING_RUN_ID"]  # [a-z0-9_-] only (spec.tracking): safe in the filter
    client = MlflowClient()
    experiment = client.get_experiment_by_name(os.environ["MLFLOW_EXPERIMENT_NAME"])
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    )
    found = client.search_runs([experiment_id], filter_string=f"tags.`{MLFLOW_TAG}` = '{ours}'", max_results=1)
    if found:
        return found[0].info.run_id
    return client.create_run(experiment_id, tags={MLFLOW_TAG: ours}, run_name=ours).info.run_id


def start_tracking(tracker: str, is_rank_zero: bool) -> None:
    """Before the Trainer starts: on rank 0 (the only one the integrations report from), point
    mlflow at the tracked run."""
    if tracker == "mlflow" and is_rank_zero:
        os.environ["MLFLOW_RUN_ID"] = mlflow_run_id()

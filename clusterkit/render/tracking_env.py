"""The job's environment for ``tracking:``: what the Trainer's integrations (and a script task's
own code) read, so that every start of the job (a requeue, a --resume) continues one tracked run."""

from __future__ import annotations

from clusterkit.spec import layout
from clusterkit.spec.network import EnvVar
from clusterkit.spec.resolved import ResolvedRecipe

WHY = "tracking: one tracked run across requeues and --resume"


def tracking_dir(recipe: ResolvedRecipe) -> str:
    """The tracker's folder: the first run's (set by submit --resume), or this run directory's."""
    return recipe.tracking.dir or f"{{run_dir}}/{layout.TRACKING_DIR}"


def tracking_env(recipe: ResolvedRecipe) -> tuple[EnvVar, ...]:
    tracking = recipe.tracking
    if tracking.tracker == "none":
        return ()
    folder = tracking_dir(recipe)
    project = tracking.project or recipe.name
    env = [EnvVar("CLUSTERKIT_TRACKING", tracking.tracker, WHY), EnvVar("CLUSTERKIT_TRACKING_DIR", folder, WHY)]
    if tracking.run_id is not None:  # None only in a render that no submit prepared
        env.append(EnvVar("CLUSTERKIT_TRACKING_RUN_ID", tracking.run_id, WHY))
    if tracking.tracker == "wandb":
        env += [
            EnvVar("WANDB_DIR", folder, f"{WHY}: wandb writes {layout.WANDB_OFFLINE_DIR}/ below it"),
            EnvVar("WANDB_PROJECT", project, WHY),
            EnvVar("WANDB_RESUME", "allow", f"{WHY}: a restart continues the run of this id"),
        ]
        if tracking.run_id is not None:
            env.append(EnvVar("WANDB_RUN_ID", tracking.run_id, WHY))
        if tracking.offline:
            env.append(
                EnvVar(
                    "WANDB_MODE",
                    "offline",
                    "tracking.offline: compute nodes without internet; `clusterkit sync` uploads",
                )
            )
    elif tracking.tracker == "mlflow":
        uri = f"file:{folder}/{layout.MLFLOW_STORE}" if tracking.offline else tracking.uri
        if uri is not None:
            env.append(EnvVar("MLFLOW_TRACKING_URI", uri, WHY))
        if tracking.offline:
            # mlflow 3 refuses its file store unless asked; SQLite's locks are unreliable on NFS/Lustre.
            env.append(EnvVar("MLFLOW_ALLOW_FILE_STORE", "true", "tracking.offline: a file store in the run directory"))
        env.append(EnvVar("MLFLOW_EXPERIMENT_NAME", project, WHY))
    else:
        env.append(EnvVar("TENSORBOARD_LOGGING_DIR", f"{folder}/{layout.TENSORBOARD_DIR}", WHY))
    return tuple(env)

"""``tracking:``: experiment tracking through the HF Trainer's own integrations (report_to).

A tracked run keeps one identity across requeues and ``submit --resume``: ``run_id`` and ``dir``
are not written by people but set by ``clusterkit submit`` (a fresh id, or the earlier run's id and
tracking folder on --resume), so they reach the job in ``job.json`` and the run record keeps them.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from clusterkit.spec.text import END, NON_EMPTY_LINE_PATTERN

Tracker = Literal["none", "wandb", "mlflow", "tensorboard"]
# wandb run ids are [a-z0-9_-] words; the same id tags the mlflow run (and is quoted in its filter).
RUN_ID_PATTERN = f"^[a-z0-9][a-z0-9_-]{{0,63}}{END}"
TRACKING_PATTERN_HINTS = {
    RUN_ID_PATTERN: "lowercase letters, digits, '_' and '-', starting with a letter or digit, at most 64"
}
TrackingRunId = Annotated[str, Meta(pattern=RUN_ID_PATTERN)]
NonEmptyLine = Annotated[str, Meta(min_length=1, pattern=NON_EMPTY_LINE_PATTERN)]


class Tracking(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    tracker: Tracker = "none"
    # Write the run on the compute node (wandb offline mode; mlflow: a file store in the run
    # directory) for `clusterkit sync` to upload from the login node. tensorboard is always local.
    offline: bool = False
    project: NonEmptyLine | None = None  # the wandb project / the mlflow experiment; default: the recipe's name
    uri: NonEmptyLine | None = None  # mlflow, online: the tracking server (MLFLOW_TRACKING_URI)
    run_id: TrackingRunId | None = None  # set by submit
    dir: NonEmptyLine | None = (
        None  # set by submit --resume: the first run's tracking folder (default <run dir>/tracking)
    )


def as_tracking(written: Tracker | Tracking) -> Tracking:
    """``tracking: wandb`` is ``tracking: {tracker: wandb}``."""
    return written if isinstance(written, Tracking) else Tracking(tracker=written)

"""``tracking:``: experiment tracking through the HF Trainer's own integrations (report_to).

A tracked run keeps one identity across requeues and ``submit --resume``: ``run_id`` and ``dir``
are not written by people but set by ``clusterkit submit`` (a fresh id, or the earlier run's id and
tracking folder on --resume), so they reach the job in ``job.json`` and the run record keeps them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

import msgspec
from msgspec import Meta

Tracker = Literal["none", "wandb", "mlflow", "tensorboard"]
# wandb run ids are [a-z0-9_-] words; the same id names the mlflow run (a tag) and nothing else.
TrackingRunId = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
Line = Annotated[str, Meta(min_length=1, pattern=r"^[^\x00-\x1f\x7f]*$")]


class Tracking(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    tracker: Tracker = "none"
    # Write the run on the compute node (wandb offline mode; mlflow: a file store in the run
    # directory) for `clusterkit sync` to upload from the login node. tensorboard is always local.
    offline: bool = False
    project: Optional[Line] = None  # the wandb project / the mlflow experiment; default: the recipe's name
    uri: Optional[Line] = None  # mlflow, online: the tracking server (MLFLOW_TRACKING_URI)
    run_id: Optional[TrackingRunId] = None  # set by submit
    dir: Optional[Line] = None  # set by submit --resume: the first run's tracking folder (default <run dir>/tracking)

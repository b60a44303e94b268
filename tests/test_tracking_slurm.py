"""Experiment tracking across real SLURM requeues: a job preempted twice (the warning signal as SLURM
sends it, then `scontrol requeue` by rank 0, as in tests/test_preemption.py) reports to ONE tracked
run whose step axis continues without a repeat."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_jobs import events, preempt_once, release, scontrol, start, wait_done

pytestmark = pytest.mark.slurm
STEPS = (
    "--set",
    "task.trainer.args.max_steps=200",
    "--set",
    "task.trainer.args.save_steps=50",
    "--set",
    "task.trainer.args.logging_steps=10",
    "--set",
    "preemption.max_requeues=2",
)


def _logged_steps(tracker: str, tracking_dir: Path, run_id: str) -> list[int]:
    if tracker == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tracking_dir / "tensorboard"))
        events.Reload()
        assert len(list((tracking_dir / "tensorboard").glob("events.out.tfevents.*"))) == 3, "one per start"
        return [event.step for event in events.Scalars("train/loss")]
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(f"file:{tracking_dir}/mlruns")
    (run,) = client.search_runs([client.get_experiment_by_name("tiny-gpt2").experiment_id])
    assert run.data.tags["clusterkit.run_id"] == run_id
    return [metric.step for metric in client.get_metric_history(run.info.run_id, "loss")]


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_two_requeues_continue_one_tracked_run(dev_cluster: str, tmp_path: Path, tracker: str) -> None:
    pytest.importorskip(tracker, reason="the [tracking] extra")
    spec = "{tracker: mlflow, offline: true}" if tracker == "mlflow" else tracker
    job_id, run_dir = start(tmp_path, *STEPS, "--set", f"tracking={spec}")
    for restart in range(2):
        preempt_once(job_id, run_dir, starts=restart + 1)
        release(job_id)
    assert "COMPLETED" in wait_done(job_id, run_dir, timeout=300)
    assert scontrol(job_id).get("Restarts") == "2"
    assert len(events(run_dir, "preempted")) == 2
    tracking = json.loads((run_dir / "run.json").read_text())["tracking"]
    assert tracking["tracker"] == tracker and tracking["dir"] == f"{run_dir}/tracking"
    steps = _logged_steps(tracker, run_dir / "tracking", tracking["run_id"])
    assert steps == sorted(set(steps)), f"a repeated or backwards step: {steps}"
    assert steps == list(range(10, 201, 10)), steps

"""``clusterkit report`` of a run on the real dev cluster that SLURM's warning signal preempted once
and the supervisor requeued: the time lost to the requeue is there, and its GPU-hours and CPU-hours
are the sum over the job's instances of sacct's elapsed x allocated GPUs (CPUs)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clusterkit.schedulers.host import LocalHost
from clusterkit.schedulers.slurm_accounting import NoAccounting, job_accounting
from conftest import REPO, run_cli
from slurm_jobs import SHORT, events, preempt_once, release, start, wait_done

pytestmark = pytest.mark.slurm


def test_report_of_a_run_preempted_once_and_resumed(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(tmp_path, *SHORT)
    preempt_once(job_id, run_dir, starts=1)
    release(job_id)
    assert "COMPLETED" in wait_done(job_id, run_dir)
    rows = job_accounting(LocalHost(), [job_id])
    deadline = time.time() + 60  # slurmdbd records a job's end a moment after it ended
    while not isinstance(rows, NoAccounting) and [r.state for r in rows][-1:] != ["COMPLETED"]:
        assert time.time() < deadline, rows
        time.sleep(1)
        rows = job_accounting(LocalHost(), [job_id])
    done = run_cli("report", "--json", str(run_dir), cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    shares = {share["bucket"]: share["seconds"] for share in report["shares"]}
    (preempted,) = events(run_dir, "preempted")
    second_start = events(run_dir, "start")[1]
    if isinstance(rows, NoAccounting):  # a dev cluster without slurmdbd: said, and estimated
        assert report["source"] == "run files" and report["note"].startswith("no SLURM accounting here")
        assert report["figures"]["gpu_hours"]["source"].startswith("estimate")
        return
    assert len(rows) == 2 and rows[-1].state == "COMPLETED", rows
    assert report["source"] == "sacct" and [job["state"] for job in report["jobs"]] == [r.state for r in rows]
    assert report["figures"]["gpu_hours"]["value"] == pytest.approx(sum(r.elapsed_s * r.gpus for r in rows) / 3600)
    assert report["figures"]["cpu_hours"]["value"] == pytest.approx(sum(r.elapsed_s * r.cpus for r in rows) / 3600)
    assert report["figures"]["cpu_hours"]["value"] > 0
    # Lost to the requeue: the first instance after its last event (its preemption checkpoint), and
    # the second's start-up until it trained again (sacct's times are whole seconds).
    first, second = rows
    expected = (first.ended.timestamp() - preempted["time"]) + (second_start["time"] - second.started.timestamp())
    assert shares["requeues"] == pytest.approx(expected, abs=2.5)
    assert shares["requeues"] > 0 and shares["training"] > 0 and shares["checkpointing"] > 0
    assert sum(shares.values()) == pytest.approx(sum(r.elapsed_s for r in rows), abs=1)
    text = run_cli("report", job_id, "--runs-dir", str(tmp_path / "runs"), cwd=REPO)
    assert text.returncode == 0 and "lost to requeues" in text.stdout and "[sacct]" in text.stdout

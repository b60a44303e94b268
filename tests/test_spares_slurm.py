"""Hot spares on the dev cluster (three nodes: two train, one spare): every rank on node2 is killed
mid-run; the same job goes on without node2, on the spare, from the newest complete checkpoint, and
completes; restarts.jsonl and status say which node, why and how long it took."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clusterkit.spec.layout import CHECKPOINTS_DIR, COMPLETE, checkpoint_name
from conftest import REPO, run_cli
from slurm_jobs import first_step_after, kill_ranks_on, metrics, rank_records, start, wait, wait_done

pytestmark = pytest.mark.slurm

SPARE = (
    "--set",
    "resources.spare_nodes=1",
    "--set",
    "task.trainer.args.max_steps=80",
    "--set",
    "task.trainer.args.save_steps=20",
    "--set",
    "task.trainer.args.logging_steps=10",
)


def test_a_dead_node_is_replaced_by_the_spare_in_the_same_job(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(tmp_path, *SPARE)
    complete = run_dir / CHECKPOINTS_DIR / checkpoint_name(20) / COMPLETE
    wait(complete.exists, 240, "the first complete checkpoint")
    wait(lambda: any(m.get("step", 0) > 20 for m in metrics(run_dir)), 120, "steps past the checkpoint")
    killed_at = kill_ranks_on(job_id, "node2")
    status = wait_done(job_id, run_dir, timeout=300)
    assert " COMPLETED " in status, status
    restarts = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert restarts[0]["dropped"] == ["node2"] and restarts[0]["job_id"] == job_id
    assert [r for r in restarts if "resumed_at" in r], restarts
    records = rank_records(run_dir)
    assert {r["slurm_node"] for r in records} == {"node1", "node3"}
    assert all(r["resumed_from"] and "checkpoint-" in r["resumed_from"] for r in records)
    starts = [m for m in metrics(run_dir) if m["event"] == "start"]
    assert len(starts) == 2 and starts[1]["step"] >= 20
    shown = run_cli("status", job_id, "--runs-dir", str(tmp_path / "runs"), "--json", cwd=REPO)
    (restart,) = json.loads(shown.stdout)["restarts"]
    first = first_step_after(run_dir, killed_at)
    assert restart["lost_s"] is not None and first is not None
    print(
        f"time lost: {restart['lost_s']} s (to the first progress), {first['time'] - killed_at:.1f} s to the next step"
    )
    assert time.time() - killed_at < 300

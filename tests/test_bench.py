"""`clusterkit bench`: the throughput arithmetic, and real runs of the tiny recipe at 1 and 2 nodes
on the dev cluster (CPU ranks stand in for GPUs), submitted as dependent jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterkit.diagnose.bench import ScaleResult, measured_throughput, with_scaling
from conftest import REPO, run_cli
from slurm_jobs import TINY


def test_throughput_excludes_warmup_and_scaling_is_against_the_smallest_scale() -> None:
    metrics = [{"event": "start", "time": 0.0, "step": 0}]
    metrics += [{"event": "log", "time": 10.0 + step, "step": step} for step in range(1, 11)]
    metrics[1]["time"] = 1.0  # a slow first step, inside the warm-up
    assert measured_throughput(metrics, global_batch=16, warmup=2) == (pytest.approx(16.0), 8)
    assert measured_throughput(metrics[:2], global_batch=16, warmup=0) == (None, 0)
    results = with_scaling(
        [
            ScaleResult(1, 2, 2, "1", "a", "COMPLETED", 100.0, 8),
            ScaleResult(2, 2, 4, "2", "b", "COMPLETED", 180.0, 8),
            ScaleResult(4, 2, 8, "3", "c", "FAILED", None, 0),
        ]
    )
    assert results[0].speedup == 1.0 and results[0].efficiency_pct == 100.0
    assert results[1].speedup == pytest.approx(1.8) and results[1].efficiency_pct == pytest.approx(90.0)
    assert results[2].speedup is None


@pytest.mark.slurm
def test_bench_one_and_two_nodes_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = run_cli(
        "bench",
        TINY,
        "--nodes",
        "1,2",
        "--steps",
        "12",
        "-o",
        str(out),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "submitted 2 scales as dependent jobs" in done.stdout
    report = json.loads((out / "bench.json").read_text())
    one, two = report["scales"]
    assert (one["gpus"], two["gpus"]) == (2, 4) and one["state"] == two["state"] == "COMPLETED"
    assert one["samples_per_s"] > 0 and two["samples_per_s"] > 0 and one["steps_measured"] >= 8
    assert one["speedup"] == 1.0 and two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert two["efficiency_pct"] == pytest.approx(100 * two["speedup"] / 2)
    # Each scale really ran at its size, with the per-GPU batch kept (weak scaling).
    for scale in (one, two):
        job = json.loads((Path(scale["run_dir"]) / "job.json").read_text())["recipe"]
        assert job["resources"]["nodes"] == scale["nodes"] and job["parallelism"]["dp"] == scale["gpus"]
        assert job["parallelism"]["global_batch_size"] == 4 * scale["gpus"]
        world = {json.loads(p.read_text())["world_size"] for p in Path(scale["run_dir"]).glob("ranks/rank-*.json")}
        assert world == {scale["gpus"]}
    second_script = (Path(two["run_dir"]) / "job.sbatch").read_text()
    assert f"#SBATCH --dependency=afterany:{one['job_id']}" in second_script
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "samples/s" in done.stdout and "efficiency" in done.stdout

"""`clusterkit gpus`, `submit --test-only` and pending reasons on the real dev cluster (three nodes,
partition debug, two stand-in GPUs each as GRES gpu)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from slurm_jobs import TINY, wait

pytestmark = pytest.mark.slurm


def _debug() -> dict:
    done = run_cli("gpus", "--json", cwd=REPO)
    assert done.returncode == 0, done.stderr
    (debug,) = [p for p in json.loads(done.stdout)["partitions"] if p["partition"] == "debug"]
    return debug


def _gpu_profile(tmp_path: Path) -> Path:
    """The dev profile, but asking SLURM for its GPUs (GRES gpu) as a GPU cluster's does."""
    text = (REPO / "recipes" / "clusters" / "dev.yaml").read_text()
    text = text.replace("accelerator: cpu", "accelerator: gpu").replace("gpu_request: none", "gpu_request: gres")
    profile = tmp_path / "devgpu.yaml"
    profile.write_text(text.replace("name: dev", "name: devgpu"))
    return profile


def test_gpus_lists_debug_with_three_nodes_of_two_gpus(dev_cluster: str) -> None:
    debug = _debug()
    assert debug["default"] and debug["nodes_total"] == 3 and debug["time_limit"] == "infinite"
    if debug["gpus_total"] == 0:
        pytest.skip("the dev cluster has no stand-in GPUs (creating device files needs root)")
    assert debug["gpus_per_node"] == [2] and debug["gpus_total"] == 6 and debug["gpu_types"] == [""]


def test_a_job_holding_two_gpus_takes_them_off_the_free_count(dev_cluster: str) -> None:
    before = _debug()
    if before["gpus_total"] == 0:
        pytest.skip("the dev cluster has no stand-in GPUs")
    job = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--nodes=1", "--gres=gpu:2", "--wrap", "sleep 120"],
        capture_output=True, text=True, check=True,
    ).stdout.strip().split(";")[0]  # fmt: skip
    try:
        wait(
            lambda: (
                subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
                == "RUNNING"
            ),
            60,
            "the GPU job to start",
        )
        after = _debug()
        assert after["gpus_free"] == before["gpus_free"] - 2, (before, after)
        assert after["nodes_idle"] == before["nodes_idle"] - 1
    finally:
        subprocess.run(["scancel", job], check=False)


def test_more_gpus_than_the_cluster_has_is_never_in_one_line(dev_cluster: str, tmp_path: Path) -> None:
    profile = _gpu_profile(tmp_path)
    runs = tmp_path / "runs"
    base = ("--cluster", str(profile), "--set", f"runs_dir={runs}", "--set", "resources.nodes=4")
    tested = run_cli("submit", TINY, "--test-only", *base, cwd=REPO)
    assert tested.returncode == 2, tested.stdout + tested.stderr
    assert tested.stderr.count("\n") == 1 and "never run" in tested.stderr and "resources.nodes" in tested.stderr
    assert not runs.exists()  # nothing written
    fits = run_cli("gpus", TINY, *base[:2], *base[4:], "--json", cwd=REPO)
    assert json.loads(fits.stdout)["recipe"]["fits"][0]["verdict"] == "never"
    fitting = run_cli("submit", TINY, "--test-only", "--cluster", str(profile), "--set", f"runs_dir={runs}", cwd=REPO)
    assert fitting.returncode == 0 and "nothing was queued" in fitting.stdout, fitting.stderr
    queue = subprocess.run(["squeue", "-h", "-n", "tiny-gpt2", "-o", "%i"], capture_output=True, text=True).stdout
    assert not queue.strip() and not runs.exists()


def test_status_of_a_job_that_can_never_run_says_so(dev_cluster: str, tmp_path: Path) -> None:
    """A job after one that was cancelled (--after is afterok): SLURM keeps it pending forever."""
    first = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300"], capture_output=True, text=True, check=True
    ).stdout.strip().split(";")[0]  # fmt: skip
    runs = tmp_path / "runs"
    done = run_cli("submit", TINY, "--after", first, "--set", f"runs_dir={runs}", cwd=REPO)
    assert done.returncode == 0, done.stderr
    job = done.stdout.split("submitted job ", 1)[1].split()[0]
    try:
        subprocess.run(["scancel", first], check=True)

        def shown() -> dict:
            return json.loads(run_cli("status", job, "--json", "--runs-dir", str(runs), cwd=REPO).stdout)

        wait(lambda: shown()["reason"] == "DependencyNeverSatisfied", 120, "SLURM to give up on the dependency")
        status = shown()
        assert status["state"] == "PENDING" and status["never"] is True and "--after" in status["explanation"]
        text = run_cli("status", job, "--runs-dir", str(runs), cwd=REPO).stdout.splitlines()
        assert len([line for line in text if "NEVER RUNS" in line]) == 1, text
    finally:
        subprocess.run(["scancel", first, job], check=False)
        time.sleep(1)

"""Twenty `clusterkit submit` processes at once for the same recipe: twenty distinct jobs and run
directories, and no two jobs on the same node with the same rendezvous port."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.slurm


def test_twenty_concurrent_submits(dev_cluster: str, tmp_path: Path) -> None:
    recipe = tmp_path / "port.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "ports",
                "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
                "task": {"script": str(REPO / "tests" / "scripts" / "report_port.py")},
                "runs_dir": str(tmp_path / "runs"),
            }
        )
    )
    submits = [
        subprocess.Popen(
            [sys.executable, "-m", "clusterkit.cli.main", "submit", str(recipe)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    outputs = [p.communicate(timeout=120) for p in submits]
    assert [p.returncode for p in submits] == [0] * 20, [err for _, err in outputs]
    job_ids = {out.split("submitted job ", 1)[1].split()[0] for out, _ in outputs}
    run_dirs = {
        line.split(": ", 1)[1] for out, _ in outputs for line in out.splitlines() if line.startswith("run dir: ")
    }
    assert len(job_ids) == 20 and len(run_dirs) == 20
    reports = [Path(d) / "port.json" for d in run_dirs]
    deadline = time.time() + 300
    while not all(r.exists() for r in reports):
        assert time.time() < deadline, "not every job ran within 300 s"
        time.sleep(1)
    seen = [json.loads(r.read_text()) for r in reports]
    pairs = {(s["node"], s["port"]) for s in seen}
    assert len(pairs) == 20, "two jobs on one node chose the same port"
    assert len({s["port"] for s in seen}) == 20


def test_concurrent_local_submits_under_one_runs_dir(tmp_path: Path) -> None:
    """Four local submits at once, two run names sharing one runs_dir: four job ids, four ports, and
    every job completes (two jobs on one rendezvous port would fail with EADDRINUSE)."""
    recipes = []
    for name in ("left", "right"):
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "resources": {"nodes": 1, "gpus_per_node": 1, "time": "5"},
                    "task": {"script": str(REPO / "tests" / "scripts" / "report_port.py")},
                    "runs_dir": str(tmp_path / "runs"),
                }
            )
        )
        recipes += [recipe, recipe]
    submits = [
        subprocess.Popen(
            [sys.executable, "-m", "clusterkit.cli.main", "submit", str(r), "--executor", "local"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in recipes
    ]
    outputs = [p.communicate(timeout=120) for p in submits]
    assert [p.returncode for p in submits] == [0] * 4, [err for _, err in outputs]
    job_ids = [out.split("submitted job ", 1)[1].split()[0] for out, _ in outputs]
    assert len(set(job_ids)) == 4
    runs = str(tmp_path / "runs")
    deadline = time.time() + 120
    while any(
        "COMPLETED"
        not in subprocess.run(
            [sys.executable, "-m", "clusterkit.cli.main", "status", job_id, "--runs-dir", runs],
            capture_output=True,
            text=True,
        ).stdout
        for job_id in job_ids
    ):
        assert time.time() < deadline, "not every local job completed within 120 s"
        time.sleep(1)
    ports = {json.loads(path.read_text())["port"] for path in (tmp_path / "runs").glob("*/*/port.json")}
    assert len(ports) == 4

"""Preflight on the dev cluster: 2 nodes x 2 ranks (CPU, gloo) join one all-reduce benchmark in the
job's own allocation. A rank made slow by the test hook (it sleeps before each all-reduce; nothing
can really slow a link here) gets its node flagged, and on_slow: fail stops the job before training."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clusterkit.runtime.preflight import CPU_SIZES, SLOW_RANK_ENV, bus_bandwidth, slow_nodes
from conftest import REPO, run_cli
from slurm_jobs import TINY, submit

pytestmark = pytest.mark.slurm


def test_bus_bandwidth_and_slow_node_rules() -> None:
    assert bus_bandwidth(10.0, 8) == pytest.approx(17.5)  # nccl-tests: algbw * 2(n-1)/n
    assert bus_bandwidth(10.0, 1) is None  # one rank moves nothing: no bus bandwidth to report
    nodes = [{"node": 0, "busbw_gbps": 10.0}, {"node": 1, "busbw_gbps": 9.0}, {"node": 2, "busbw_gbps": 4.0}]
    assert slow_nodes(nodes, 0.8) == [2] and slow_nodes(nodes, 0.3) == []
    assert slow_nodes([{"node": 0, "busbw_gbps": None}], 0.8) == []


def _run_dir(output: str) -> Path:
    return Path(next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("run dir: ")))


def test_preflight_measures_bus_bandwidth_per_size_and_node(dev_cluster: str, tmp_path: Path) -> None:
    done = run_cli(
        "preflight", TINY, "--set", f"runs_dir={tmp_path / 'runs'}", "--set", "preflight.slow_fraction=0.1", cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = _run_dir(done.stdout)
    result = json.loads((run_dir / "preflight.json").read_text())
    assert (result["world_size"], result["nodes"], result["ranks_per_node"], result["backend"]) == (4, 2, 2, "gloo")
    assert [row["bytes"] for row in result["sizes"]] == list(CPU_SIZES)
    for row in result["sizes"]:
        assert row["time_s"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)
    assert sorted(n["host"] for n in result["per_node"]) == ["node1", "node2"]
    assert all(n["busbw_gbps"] > 0 for n in result["per_node"]) and result["slow_nodes"] == []
    assert "intra-node busbw" in done.stdout  # the table, printed by the command
    log = (run_dir / f"{run_dir.name}_0_log.out").read_text()
    assert "clusterkit preflight: all-reduce over 4 ranks on 2 nodes (gloo)" in log and "preflight only" in log
    assert not (run_dir / "metrics.jsonl").exists(), "preflight.only trains nothing"


def test_a_slow_rank_flags_its_node_and_on_slow_fail_stops_training(dev_cluster: str, tmp_path: Path) -> None:
    env = {**os.environ, SLOW_RANK_ENV: "3:0.2"}  # global rank 3 = node 1's second rank
    rc, run_dir, output = submit(
        tmp_path, TINY, "--set", "preflight={enabled: true, on_slow: fail, slow_fraction: 0.5}", env=env
    )
    assert rc == 1, output
    result = json.loads((run_dir / "preflight.json").read_text())
    assert result["slow_nodes"] == [1]
    slow = result["per_node"][1]
    assert slow["host"] == "node2" and slow["busbw_gbps"] < 0.5 * result["per_node"][0]["busbw_gbps"]
    assert not (run_dir / "metrics.jsonl").exists(), "the job stopped before training"
    status = run_cli("status", str(run_dir), cwd=REPO)
    assert "FAILED" in status.stdout and "first failure: preflight: node 1 (node2," in status.stdout
    assert "SLOW" in (run_dir / f"{run_dir.name}_0_log.out").read_text()


def test_preflight_under_the_deepspeed_launcher(tmp_path: Path) -> None:
    """The DeepSpeed launcher passes --local_rank before the script's arguments (local executor: the
    same batch script, one process per node on this machine)."""
    done = run_cli(
        "preflight",
        TINY,
        "--executor",
        "local",
        "--set",
        "launcher=deepspeed",
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "preflight.slow_fraction=0.01",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((_run_dir(done.stdout) / "preflight.json").read_text())
    assert (result["world_size"], result["nodes"]) == (4, 2) and len(result["per_node"]) == 2

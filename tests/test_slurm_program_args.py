"""Issue 31 on the real dev cluster (sbatch, srun, two slurmd): ``submit RECIPE -- ARGS`` reaches the
script on every node byte for byte, and ``{env:NAME}`` is filled in on each node from that node's
environment (SLURMD_NODENAME differs per node; CK_SITE comes from the submitting shell, as sbatch
exports it). The local-executor twin is test_program_args.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from slurm_jobs import submit

pytestmark = pytest.mark.slurm

SCRIPT = REPO / "tests" / "scripts" / "argv_json.py"


def test_arguments_and_env_values_reach_the_script_on_each_node(dev_cluster: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    site = f"/scratch/$(touch {canary}/site) 'q' \"d\"\n{{env:HOME}}"
    recipe = tmp_path / "args.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "slurm-args",
                "cluster": "dev",
                "launcher": "python",
                "resources": {"nodes": 2, "gpus_per_node": 1, "time": "5"},
                "task": {"script": str(SCRIPT), "args": ["{env:SLURMD_NODENAME}", "--data={env:CK_SITE}/d"]},
                "env": {"CK_NODE": "on {env:SLURMD_NODENAME}", "ARGV_JSON_ENV": "CK_NODE"},
            }
        )
    )
    words = ["--lr", "3e-4", "--", "a b", "", f"$(touch {canary}/arg)", "é😀", "x\ny", "--set", "resources.nodes=9"]
    rc, run_dir, output = submit(tmp_path, str(recipe), "--", *words, env={**os.environ, "CK_SITE": site})
    assert rc == 0, output
    seen = [json.loads(p.read_text()) for p in sorted((run_dir / "argv").glob("rank-*.json"))]
    assert len(seen) == 2 and len({record["node"] for record in seen}) == 2, seen
    for record in seen:
        node = record["node"]
        expected = [node, f"--data={site}/d", *words]
        assert record["argv"] == expected
        assert record["argv_hex"] == [word.encode().hex() for word in expected]
        assert record["env"] == {"CK_NODE": f"on {node}"}
    assert sorted(os.listdir(canary)) == []
    overrides = json.loads((run_dir / "run.json").read_text())["overrides"]
    assert "task.args+=" + json.dumps(words, ensure_ascii=False) in overrides


def test_an_unset_variable_fails_the_job_naming_it(dev_cluster: str, tmp_path: Path) -> None:
    recipe = tmp_path / "unset.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "slurm-unset",
                "cluster": "dev",
                "launcher": "python",
                "resources": {"nodes": 1, "gpus_per_node": 1, "time": "5"},
                "task": {"script": str(SCRIPT), "args": ["{env:CK_NEVER_SET_ANYWHERE}"]},
            }
        )
    )
    rc, run_dir, output = submit(tmp_path, str(recipe))
    assert rc == 1, output
    status = run_cli("status", str(run_dir), cwd=REPO)
    assert "FAILED" in status.stdout, status.stdout
    assert "{env:CK_NEVER_SET_ANYWHERE} in the launch step: the variable CK_NEVER_SET_ANYWHERE is not set on" in (
        status.stdout
    ), status.stdout

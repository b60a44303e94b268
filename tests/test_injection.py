"""Hostile values in every place a recipe value reaches the shell, rendered and then executed by
real bash (through the local executor's srun stand-in): canary files must never appear and the
script must receive every value byte for byte."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from conftest import REPO, run_cli


def _hostile(canary: Path) -> list[str]:
    return [
        f"$(touch {canary}/dollar-paren)",
        f"`touch {canary}/backtick`",
        f"'; touch {canary}/single-quote; '",
        f'"; touch {canary}/double-quote; "',
        f"x\ntouch {canary}/newline",
        f"a;touch {canary}/semicolon",
        "%j %t %N 100%",
        "{{ 7 * 7 }} {% if true %}jinja{% endif %}",
        "$HOME ${PATH} \\$SLURM_NODEID",
        "a=b,c=d",
        "CLUSTERKIT_EOF",
        "",
    ]


def _wait_done(run_dir: Path, timeout: float = 180) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "exit_code").exists():
            return int((run_dir / "exit_code").read_text())
        time.sleep(0.5)
    raise AssertionError(f"no exit code in {run_dir} after {timeout} s")


@pytest.mark.parametrize("executor", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_hostile_values_are_inert_when_executed(tmp_path: Path, executor: str, request: pytest.FixtureRequest) -> None:
    if executor == "slurm":
        request.getfixturevalue("dev_cluster")  # real sbatch parses the header, real srun starts the nodes
    canary = tmp_path / "canary"
    canary.mkdir()
    hostile = _hostile(canary)
    script = REPO / "tests" / "scripts" / "echo_contract.py"
    recipe = {
        "name": "inject",
        "description": f"x\nCLUSTERKIT_EOF\ntouch {canary}/heredoc",
        "resources": {
            "nodes": 2,
            "gpus_per_node": 1,
            "time": "5",
            "account": hostile[0],
            "extra_sbatch": {"comment": hostile[2]},
        },
        "task": {"script": str(script), "args": hostile},
        "env": {f"HOSTILE_{i}": value for i, value in enumerate(hostile)},
        "network": {"env": {"NET_HOSTILE": hostile[1]}},
        "runs_dir": str(tmp_path / f"runs $(touch {canary}/runs-dir)"),
    }
    recipe_path = tmp_path / "inject.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    done = run_cli("submit", str(recipe_path), "--executor", executor, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = Path(next(line for line in done.stdout.splitlines() if line.startswith("run dir: ")).split(": ", 1)[1])
    assert _wait_done(run_dir) == 0, (run_dir / f"{run_dir.name}_0_log.err").read_text()
    assert sorted(os.listdir(canary)) == [], "a hostile value was executed"
    for rank in (0, 1):
        seen = json.loads((run_dir / "contract" / f"rank-{rank}.json").read_text())
        assert seen["argv"] == hostile
        for i, value in enumerate(hostile):
            assert seen["env"][f"HOSTILE_{i}"] == value
        assert seen["env"]["NET_HOSTILE"] == hostile[1]
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    assert resolved["description"] == recipe["description"]


def test_hostile_values_in_rendered_sbatch_header_stay_single_lines(tmp_path: Path) -> None:
    recipe_path = tmp_path / "r.yaml"
    recipe_path.write_text(
        yaml.safe_dump(
            {
                "name": "hdr",
                "task": {"script": "x.py"},
                "resources": {
                    "time": "5",
                    "partition": "$(reboot)",
                    "account": "a'b",
                    "extra_sbatch": {"comment": "c d"},
                },
            }
        )
    )
    script = render_job(load_recipe(recipe_path)).script
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition='$(reboot)'" in header
    assert "#SBATCH --account='a'\"'\"'b'" in header
    assert "#SBATCH --comment='c d'" in header

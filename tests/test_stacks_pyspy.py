"""py-spy for the ranks that do not answer the stacks signal, with real processes on the local
executor: ranks whose Python runs isolated (``python -I``: no PYTHONPATH, so no site folder and no
faulthandler) are dumped by their node agent with py-spy, and the output says so."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli

SCRIPT = str(REPO / "tests" / "scripts" / "hang_rank.py")


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is in the [test] extra: pip install -e '.[test]'")
def test_ranks_that_skip_the_site_folder_are_dumped_with_py_spy(tmp_path: Path) -> None:
    body = {
        "name": "isolated",
        "cluster": "dev",
        "launcher": "python",
        "python": ["python3", "-I"],
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": SCRIPT, "args": [str(tmp_path / "out"), "1000", "--hang-rank", "1", "--hang-after", "2"]},
        "snapshot": False,
    }
    recipe = tmp_path / "isolated.yaml"
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)["run"]["job_id"]
    deadline = time.monotonic() + 60
    while not (tmp_path / "out" / "rank1.values").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    try:
        done = run_cli("stacks", job, "--runs-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        ranks = {p["rank"]: p for p in summary["processes"] if p["rank"] is not None}
        assert sorted(ranks) == [0, 1] and {p["method"] for p in ranks.values()} == {"py-spy"}
        assert ranks[1]["where"].startswith("stuck_waiting_for_data") or ranks[1]["where"].startswith("sleep")
        assert "py-spy for ranks 0, 1, which did not answer it" in summary["method"]
        assert "rank 1 on" in summary["summary"]["line"]
    finally:
        run_cli("cancel", job, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)

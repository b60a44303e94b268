"""The preemption signal reaches the ranks of a real job on the local executor: the batch process
(the supervisor) gets it as SLURM's --signal=B: delivers it, passes it to the launch step (the local
srun stand-in), whose node agents pass it to each rank that handles it. Under launcher: python each
rank starts with the signal at its default, so a framework that arms only where no handler exists
(Lightning's auto-requeue) does arm."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import yaml

from conftest import REPO, run_cli

SCRIPT = str(REPO / "tests" / "scripts" / "await_preemption.py")


def test_every_rank_of_a_task_per_gpu_job_gets_the_preemption_signal(tmp_path: Path) -> None:
    body = {
        "name": "sig",
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": SCRIPT},
        "snapshot": False,
    }
    recipe = tmp_path / "sig.yaml"
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["run"]
    run_dir = Path(record["run_dir"])
    out = run_dir / "preemption"
    deadline = time.monotonic() + 60
    while len(list(out.glob("rank-*.ready"))) < 4:
        assert time.monotonic() < deadline, sorted(os.listdir(run_dir))
        time.sleep(0.2)
    os.kill(record["pid"], signal.SIGUSR2)  # as SLURM's --signal=B:USR2: to the batch process only
    while not (run_dir / "exit_code").exists():
        assert time.monotonic() < deadline + 60, sorted(os.listdir(out))
        time.sleep(0.2)
    assert sorted(path.read_text() for path in out.glob("rank-*.start")) == ["default"] * 4
    assert sorted(path.read_text() for path in out.glob("rank-*.got")) == ["USR2"] * 4
    assert (run_dir / "exit_code").read_text() == "0\n"

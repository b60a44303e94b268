"""A hung job on the local executor, with real processes: four ranks of a script task (2 nodes x 2)
where rank 1 stops in a Python function after step 3 while the others block in a gloo all_reduce.
The watchdog finds it, takes every rank's stacks (faulthandler, registered by the supervisor's
sitecustomize: the script does nothing for it), names rank 1 and ends the job; `status` says HUNG.
And `clusterkit stacks` on a healthy job answers without disturbing it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from clusterkit.spec.layout import batch_log
from conftest import REPO, run_cli

SCRIPT = str(REPO / "tests" / "scripts" / "hang_rank.py")


def _submit(tmp_path: Path, args: list[str], watchdog: dict | None) -> tuple[dict, Path]:
    body = {
        "name": "hang",
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": SCRIPT, "args": [str(tmp_path / "out"), *args]},
        "snapshot": False,
        **({"watchdog": watchdog} if watchdog else {}),
    }
    recipe = tmp_path / "hang.yaml"
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["run"]
    return record, Path(record["run_dir"])


def _wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} after {seconds} s"
        time.sleep(0.2)


def test_the_watchdog_names_the_hung_rank_and_ends_the_job(tmp_path: Path) -> None:
    record, run_dir = _submit(
        tmp_path, ["50", "--hang-rank", "1", "--hang-after", "3"], {"no_progress": "5s", "startup": "2m"}
    )
    _wait_for(run_dir / "exit_code", 90)
    assert (run_dir / "exit_code").read_text() == "124\n"
    hang = json.loads((run_dir / "hang.json").read_text())
    assert hang["why"].startswith("no progress for"), hang
    assert hang["line"].startswith("3 of 4 ranks are in all_reduce"), hang["line"]
    assert "rank 1 on 127.0.0." in hang["line"] and "is in stuck_waiting_for_data at hang_rank.py" in hang["line"]
    summary = json.loads((run_dir / "ranks" / "stacks" / "summary.json").read_text())
    ranks = {p["rank"]: p for p in summary["processes"] if p["rank"] is not None and not p["child"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[1]["where"].startswith("stuck_waiting_for_data")
    # every rank got through step 3 and no further
    assert all((tmp_path / "out" / f"rank{r}.values").read_text().split()[-1] == "30" for r in range(4))
    status = run_cli("status", record["job_id"], "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert "FAILED" in status.stdout and "HUNG: no progress for" in status.stdout, status.stdout
    assert "rank 1 on 127.0.0." in status.stdout
    log = (run_dir / batch_log(record["job_id"], "out")).read_text()
    assert "clusterkit: HUNG:" in log and "watchdog.action: fail" in log, log[-2000:]


def test_stacks_of_a_healthy_job_leave_it_unharmed(tmp_path: Path) -> None:
    steps = 40
    record, run_dir = _submit(tmp_path, [str(steps), "--step-s", "0.15"], None)
    _wait_for(tmp_path / "out" / "rank3.values", 60)
    started = time.monotonic()
    done = run_cli("stacks", record["job_id"], "--runs-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 10
    summary = json.loads(done.stdout)
    ranks = sorted(p["rank"] for p in summary["processes"] if p["rank"] is not None and not p["child"])
    assert ranks == [0, 1, 2, 3], summary["summary"]
    assert summary["summary"]["missing"] == []
    assert "faulthandler" in summary["method"]
    one = run_cli("stacks", record["job_id"], "--runs-dir", str(tmp_path / "runs"), "--rank", "2", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert "rank 2 on" in one.stdout and "rank 0 on" not in one.stdout.split("\n", 2)[2]
    _wait_for(run_dir / "exit_code", 90)
    assert (run_dir / "exit_code").read_text() == "0\n"
    # Every step's all-reduced value, exactly as an undisturbed run computes it: 10 * step.
    expected = " ".join(f"{10 * step:g}" for step in range(1, steps + 1))
    assert all((tmp_path / "out" / f"rank{r}.values").read_text() == expected for r in range(4))
    ended = run_cli("stacks", record["job_id"], "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert ended.returncode == 2 and "is COMPLETED: stacks are taken from a running job" in ended.stderr

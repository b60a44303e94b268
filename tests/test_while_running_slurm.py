"""While a job runs, on the dev cluster (real slurmctld/slurmd, srun, gloo ranks on two nodes): a
script task whose rank 1 stops in a Python function while the others block in an all_reduce, ended
by the watchdog and named; the built-in runner whose rank 1 waits on a stopped data-loader worker
(as one stuck in I/O), named the same way; `clusterkit stacks` on a healthy built-in run, which
answers within 10 s and leaves the loss curve exactly as an untouched run's; a rank slow to read its
data named as a straggler; steps 10-15 of rank 0 profiled. (exec: test_into_job.py; top: test_top.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from slurm_jobs import LONG, metrics, start, wait, wait_done

pytestmark = pytest.mark.slurm
SCRIPT = str(REPO / "tests" / "scripts" / "hang_rank.py")


def _submit_script(tmp_path: Path, name: str, task: dict, **fields) -> dict:
    """A script task on both nodes, two ranks each (launcher python): its run record."""
    recipe = tmp_path / f"{name}.yaml"
    body = {
        "name": name,
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": task,
        "snapshot": False,
        **fields,
    }
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run"]


def test_a_script_whose_rank_hangs_is_ended_within_90_s_and_named(dev_cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _submit_script(
        tmp_path,
        "hang",
        {"script": SCRIPT, "args": [str(out), "1000", "--hang-rank", "1", "--hang-after", "3"]},
        watchdog={"no_progress": "30s", "startup": "5m"},
    )
    run_dir = Path(run["run_dir"])
    wait(lambda: (run_dir / "exit_code").exists(), 240, "the hung job to be ended")
    hung_at = max((out / f"rank{rank}.values").stat().st_mtime for rank in range(4))  # the last step
    assert (run_dir / "exit_code").stat().st_mtime - hung_at < 90
    assert (run_dir / "exit_code").read_text() == "124\n"
    hang = json.loads((run_dir / "hang.json").read_text())
    assert hang["line"].startswith("3 of 4 ranks are in all_reduce at distributed_c10d.py"), hang
    assert "rank 1 on node1 is in stuck_waiting_for_data at hang_rank.py" in hang["line"], hang
    summary = json.loads((run_dir / "ranks" / "stacks" / "summary.json").read_text())
    ranks = {p["rank"]: p for p in summary["processes"] if p["rank"] is not None and not p["child"]}
    assert sorted(ranks) == [0, 1, 2, 3] and {ranks[r]["host"] for r in (2, 3)} == {"node2"}
    status = wait_done(run["job_id"], run_dir)
    assert " FAILED " in status and "HUNG: no progress for" in status and "rank 1 on node1" in status, status


def _worker_of(rank: int, job_id: str) -> int:
    """The data-loader worker of ``rank``: a process of the job with that rank whose parent has it too
    (/proc/PID/environ is the environment a process started with: a forked worker's is its rank's)."""

    def environ(pid: int) -> dict[str, str]:
        try:
            text = Path(f"/proc/{pid}/environ").read_text()
        except OSError:
            return {}
        return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)

    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    def is_rank(pid: int) -> bool:
        env = environ(pid)
        return env.get("SLURM_JOB_ID") == job_id and env.get("RANK") == str(rank)

    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and is_rank(int(entry.name)):
            try:
                if is_rank(parent(int(entry.name))):
                    return int(entry.name)
            except (OSError, IndexError):
                continue
    raise AssertionError(f"no data-loader worker of rank {rank} found")


def test_the_built_in_runner_with_a_stuck_data_loader_is_named(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(
        tmp_path,
        *LONG,
        "--set",
        "task.trainer.args.dataloader_num_workers=1",
        "--set",
        "watchdog.no_progress=20s",
    )
    wait(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 2, 180, "training to log")
    worker = _worker_of(1, job_id)
    os.kill(worker, signal.SIGSTOP)  # as a worker stuck in the kernel on a dead file system
    try:
        status = wait_done(job_id, run_dir, timeout=240)
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    hang = json.loads((run_dir / "hang.json").read_text())
    assert "rank 1 on node1 is in" in hang["line"] and hang["line"].startswith("3 of 4 ranks are in"), hang
    assert " FAILED " in status and "HUNG:" in status, status


def test_stacks_of_a_healthy_run_leave_its_loss_curve_as_it_was(dev_cluster: str, tmp_path: Path) -> None:
    steps = ("--set", "task.trainer.args.max_steps=60", "--set", "task.trainer.args.logging_steps=5")
    job_id, run_dir = start(tmp_path / "asked", *steps)
    wait(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 2, 180, "training to log")
    for _ in range(2):
        asked = time.monotonic()
        done = run_cli("stacks", job_id, "--runs-dir", str(tmp_path / "asked" / "runs"), "--json", cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - asked < 10
        summary = json.loads(done.stdout)
        ranks = sorted(p["rank"] for p in summary["processes"] if p["rank"] is not None and not p["child"])
        assert ranks == [0, 1, 2, 3] and summary["summary"]["missing"] == [], summary["summary"]
        assert {p["host"] for p in summary["processes"] if p["rank"] in (2, 3)} == {"node2"}
    assert " COMPLETED " in wait_done(job_id, run_dir)
    untouched_id, untouched_dir = start(tmp_path / "untouched", *steps)
    assert " COMPLETED " in wait_done(untouched_id, untouched_dir)

    def losses(path: Path) -> list[float]:
        return [m["loss"] for m in metrics(path) if m["event"] == "log"]

    assert len(losses(run_dir)) == 12 and losses(run_dir) == losses(untouched_dir)


def test_stacks_of_a_job_that_is_not_running_are_refused_in_one_line(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(tmp_path, "--set", "task.trainer.args.max_steps=2")
    wait_done(job_id, run_dir)
    done = run_cli("stacks", job_id, "--runs-dir", str(tmp_path / "runs"), cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is COMPLETED: stacks are taken from a running job" in done.stderr


def test_a_rank_slow_to_read_its_data_is_named_as_a_straggler(dev_cluster: str, tmp_path: Path) -> None:
    """Rank 3 (on node2) sleeps 0.25 s in its data collator each step (the test script's own doing)."""
    run = _submit_script(
        tmp_path,
        "slow",
        {"script": str(REPO / "tests" / "scripts" / "slow_rank_training.py")},
        env={"SLOW_RANK_FOR_TEST": "3", "STEPS_FOR_TEST": "12"},
    )
    status = wait_done(run["job_id"], Path(run["run_dir"]))
    # It failed once in a full run (exit 143 after all 12 steps) and never alone: the logs say why next time.
    logs = "".join(p.read_text()[-1500:] for p in sorted(Path(run["run_dir"]).rglob("*_log.err")))
    assert " COMPLETED " in status, status + logs
    shown = run_cli("status", run["job_id"], "--runs-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
    straggler = json.loads(shown.stdout)["straggler"]
    assert straggler["rank"] == 3 and straggler["host"] == "node2", straggler
    assert straggler["slower"] > 0.15 and straggler["summary"].startswith("rank 3 on node"), straggler


def test_steps_10_to_15_of_rank_0_are_profiled_into_a_trace_that_loads(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(
        tmp_path, "--set", "task.trainer.args.max_steps=20", "--set", "profile={kind: torch, ranks: [0], steps: 10-15}"
    )
    assert " COMPLETED " in wait_done(job_id, run_dir)
    traces = sorted((run_dir / "profile").glob("*.json"))
    assert [trace.name for trace in traces] == ["rank0-steps10-15.json"]
    events = json.loads(traces[0].read_text())["traceEvents"]
    marked = {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert marked == {f"ProfilerStep#{step}" for step in range(10, 16)}, marked

"""Helpers for the tests that submit real jobs (dev cluster, local executor): submitting one, waiting
for it, reading what its ranks recorded, and preempting or releasing it as SLURM would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import REPO, run_cli

TINY = str(REPO / "recipes" / "tiny-gpt2-cpu.yaml")


def submit(workdir: Path, recipe: str, *extra: str, env: dict[str, str] | None = None) -> tuple[int, Path, str]:
    done = run_cli("submit", recipe, "--follow", "--set", f"runs_dir={workdir / 'runs'}", *extra, cwd=REPO, env=env)
    run_dirs = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run dir: ")]
    assert run_dirs, done.stdout + done.stderr
    return done.returncode, Path(run_dirs[0]), done.stdout + done.stderr


def rank_records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("ranks/rank-*.json"))]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_real_data_parallel(run_dir: Path, world: int, nodes: set[str]) -> None:
    ranks = rank_records(run_dir)
    assert sorted(r["rank"] for r in ranks) == list(range(world))
    assert {r["world_size"] for r in ranks} == {world} and {r["dist_world_size"] for r in ranks} == {world}
    assert {r["slurm_node"] for r in ranks} == nodes
    first_batches = [r["batch_fingerprints"][0] for r in ranks]
    assert len(set(first_batches)) == world, "every rank must see a different batch"
    checksums = {round(r["parameter_checksum"], 6) for r in ranks}
    assert len(checksums) == 1, f"parameters differ across ranks: {checksums}"
    losses = [m["loss"] for m in metrics(run_dir) if m["event"] == "log"]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    # start and log lines say the world they ran in (a checkpoint line times a save, nothing more)
    assert {m["world_size"] for m in metrics(run_dir) if m["event"] in ("start", "log")} == {world}


LONG = (
    "--set",
    "task.trainer.args.max_steps=400",
    "--set",
    "task.trainer.args.save_steps=100",
    "--set",
    "task.trainer.args.logging_steps=10",
)
# A run short enough to preempt once and finish: a checkpoint every 40 of its 120 steps.
SHORT = (
    "--set",
    "task.trainer.args.max_steps=120",
    "--set",
    "task.trainer.args.save_steps=40",
    "--set",
    "task.trainer.args.logging_steps=10",
)


def start(tmp_path: Path, *extra: str) -> tuple[str, Path]:
    done = run_cli("submit", TINY, "--set", f"runs_dir={tmp_path / 'runs'}", *extra, cwd=REPO)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    return job_id, tmp_path / "runs" / "tiny-gpt2" / job_id


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def events(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        m for m in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if m["event"] == kind
    ]


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(part.split("=", 1) for part in out.split() if "=" in part)


def preempt_once(job_id: str, run_dir: Path, starts: int) -> None:
    """Wait until the run's `starts`-th start has logged a step, then send the warning signal."""
    wait(
        lambda: (
            len(events(run_dir, "start")) >= starts
            and any(m["time"] > events(run_dir, "start")[-1]["time"] for m in events(run_dir, "log"))
        ),
        120,
        f"training start #{starts}",
    )
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], check=True)


def nodes_idle() -> bool:
    states = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T", "-n", "node1,node2"], capture_output=True, text=True
    ).stdout.split()
    return states == ["idle", "idle"]


def release(job_id: str) -> None:
    # SLURM 22.05 holds a requeued job ~120 s (Reason=BeginTime); make it eligible now — but only once
    # the previous run has left the nodes, or slurmd refuses it ("Job credential revoked").
    wait(lambda: scontrol(job_id).get("JobState") == "PENDING", 60, "the job to be requeued")
    wait(nodes_idle, 60, "the nodes to be released")
    # slurmd compares credential times in whole seconds with the requeue's revocation time: a new
    # start within the same second is refused as revoked.
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)


def wait_done(job_id: str, run_dir: Path, timeout: float = 180) -> str:
    def done() -> bool:
        return (
            " COMPLETED " in run_status(job_id, run_dir)
            or " FAILED " in run_status(job_id, run_dir)
            or " PREEMPTED " in run_status(job_id, run_dir)
        )

    wait(done, timeout, "the job to end")
    return run_status(job_id, run_dir)


def run_status(job_id: str, run_dir: Path) -> str:
    return run_cli("status", str(run_dir), cwd=REPO).stdout.replace("  ", " ") + " "


def rank_pids_on(job_id: str, node: str) -> list[int]:
    """The ranks of a job running on a dev-cluster node (all its nodes are processes of this machine):
    processes whose start environment has the job's id, that node's name and a RANK."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            items = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURMD_NODENAME") == node and "RANK" in env:
            found.append(int(entry.name))
    return found


def kill_ranks_on(job_id: str, node: str) -> float:
    """SIGKILL every rank of the job on ``node`` (as a node that dies under them); when."""
    pids = rank_pids_on(job_id, node)
    assert pids, f"no ranks of job {job_id} on {node}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return time.time()


def first_step_after(run_dir: Path, when: float) -> dict | None:
    """Rank 0's first step line (the runner writes one per step) later than ``when``."""
    path = run_dir / "ranks" / "steps" / "rank0.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)
        except ValueError:
            continue
        if step.get("time", 0) > when:
            return step
    return None

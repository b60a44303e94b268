"""Preemption, requeue and resume on the real dev cluster; a node's ranks killed mid-run; a
half-written checkpoint. SLURM's warning signal is simulated exactly as SLURM delivers it with
--signal=B:USR2@grace: to the batch shell only (scancel --signal=USR2 --batch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterkit.spec.layout import CHECKPOINTS_DIR, COMPLETE, checkpoint_name
from conftest import REPO, run_cli
from slurm_jobs import (
    LONG,
    SHORT,
    TINY,
    events,
    preempt_once,
    rank_records,
    release,
    scontrol,
    start,
    submit,
    wait,
    wait_done,
)

pytestmark = pytest.mark.slurm


def test_requeued_run_resumes_and_matches_an_uninterrupted_one(dev_cluster: str, tmp_path: Path) -> None:
    steps = SHORT
    job_id, run_dir = start(tmp_path, *steps)
    preempt_once(job_id, run_dir, starts=1)
    release(job_id)
    assert "COMPLETED" in wait_done(job_id, run_dir)
    assert scontrol(job_id).get("Restarts") == "1"
    (preempted,) = events(run_dir, "preempted")
    records = rank_records(run_dir)
    assert {r["global_step"] for r in records} == {120}, "ends at exactly the configured step count"
    resumed_step = int(Path(records[0]["resumed_from"]).name.split("-")[1])
    assert resumed_step == preempted["step"], "the checkpoint is taken at the preempted step: no work redone"
    logged_before = max(m["step"] for m in events(run_dir, "log") if m["time"] < preempted["time"])
    assert preempted["step"] - logged_before <= 40
    # The same seed without interruption: the final loss is in line.
    rc, plain_dir, output = submit(tmp_path, TINY, *steps, "--set", "name=uninterrupted")
    assert rc == 0, output
    final = events(run_dir, "log")[-1]["loss"]
    uninterrupted = events(plain_dir, "log")[-1]["loss"]
    assert abs(final - uninterrupted) / uninterrupted < 0.05, (final, uninterrupted)


def test_three_requeues_then_max_requeues_stops_cleanly(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(tmp_path, *LONG, "--set", "preemption.max_requeues=3")
    for restart in range(3):
        preempt_once(job_id, run_dir, starts=restart + 1)
        release(job_id)
    preempt_once(job_id, run_dir, starts=4)
    status = wait_done(job_id, run_dir)
    assert "PREEMPTED" in status and "max_requeues (3) reached" in status and "submit --resume" in status
    assert scontrol(job_id).get("Restarts") == "3"
    steps = [m["step"] for m in events(run_dir, "preempted")]
    assert len(steps) == 4 and steps == sorted(steps)
    starts = [m["step"] for m in events(run_dir, "start")]
    assert starts[1:] == steps[:3], "each restart resumes where the previous one stopped"


def test_the_secrets_file_stays_for_the_requeue_and_goes_with_the_run(dev_cluster: str, tmp_path: Path) -> None:
    """max_requeues > 0: the requeued start reads the secrets again (the run completes), and once the run
    ended for good the file is gone from its run directory."""
    steps = SHORT
    done = run_cli(
        "submit",
        TINY,
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "secrets=[CK_TEST_TOKEN]",
        "--set",
        "preemption.max_requeues=2",
        *steps,
        cwd=REPO,
        env={**os.environ, "CK_TEST_TOKEN": "requeue-secret-MARK"},
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "tiny-gpt2" / job_id
    preempt_once(job_id, run_dir, starts=1)
    release(job_id)
    assert (run_dir / ".secrets.env").exists(), "the requeued start needs it"
    assert "COMPLETED" in wait_done(job_id, run_dir)
    assert scontrol(job_id).get("Restarts") == "1"
    time.sleep(2)  # the batch script removes it as it exits
    assert not (run_dir / ".secrets.env").exists() and not (run_dir / "requeued").exists()


def _rank_processes(job_id: str, node: str) -> dict[int, str]:
    """pid → LOCAL_RANK of the rank processes torchrun started for this job on this node: its
    children (not torchrun itself, whose command line names the entry point too)."""
    procs = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(proc.name)] = (cmdline, environ, ppid)
    found = {}
    for pid, (cmdline, environ, ppid) in procs.items():
        parent = procs.get(ppid, (b"", [], 0))[0]
        local_rank = next((v[len(b"LOCAL_RANK=") :].decode() for v in environ if v.startswith(b"LOCAL_RANK=")), None)
        if (
            b"clusterkit.runtime.runner" in cmdline
            and b"torch.distributed.run" in parent
            and local_rank is not None
            and f"SLURM_JOB_ID={job_id}".encode() in environ
            and f"SLURMD_NODENAME={node}".encode() in environ
        ):
            found[pid] = local_rank
    return found


def test_killed_node_ends_the_job_and_resume_finishes_it(dev_cluster: str, tmp_path: Path) -> None:
    job_id, run_dir = start(tmp_path, *LONG, "--set", "task.trainer.args.save_steps=10")
    # Killed after its first complete checkpoint: a run with none cannot be resumed (submit refuses it).
    wait(lambda: any(run_dir.glob("checkpoints/checkpoint-*/.clusterkit-complete")), 120, "a complete checkpoint")
    ranks = _rank_processes(job_id, "node2")
    assert sorted(ranks.values()) == ["0", "1"], ranks
    killed = time.time()
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    status = wait_done(job_id, run_dir, timeout=60)
    assert time.time() - killed < 60
    assert "FAILED" in status and "first failure: rank " in status and "(node 1, node2)" in status
    assert "SIGKILL" in status or "-9" in status
    rc, resumed, output = submit(tmp_path, TINY, "--resume", str(run_dir), "--set", "task.trainer.args.max_steps=120")
    assert rc == 0, output
    records = rank_records(resumed)
    assert {r["global_step"] for r in records} == {120}
    assert len({r["resumed_from"] for r in records}) == 1 and records[0]["resumed_from"].startswith(str(run_dir))


def test_half_written_checkpoint_is_ignored(dev_cluster: str, tmp_path: Path) -> None:
    rc, first, output = submit(
        tmp_path, TINY, "--set", "task.trainer.args.max_steps=10", "--set", "task.trainer.args.save_steps=5"
    )
    assert rc == 0, output
    assert (first / "checkpoints" / "checkpoint-10" / ".clusterkit-complete").exists()
    assert (first / "checkpoints" / "latest").read_text().strip() == "checkpoint-10"
    torn = first / "checkpoints" / "checkpoint-12"  # a write that was cut off: no completion marker
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\0" * 100)
    rc, second, output = submit(tmp_path, TINY, "--resume", str(first), "--set", "task.trainer.args.max_steps=15")
    assert rc == 0, output
    assert {r["resumed_from"] for r in rank_records(second)} == {str(first / "checkpoints" / "checkpoint-10")}
    assert {r["global_step"] for r in rank_records(second)} == {15}


def test_a_retry_after_a_killed_node_excludes_that_node(dev_cluster: str, tmp_path: Path) -> None:
    """Every rank on the job's node dies (SIGKILL) on the first attempt: the batch script traces the
    failure to that node and submits the retry as a new job excluding it, recorded in retries.jsonl;
    the retry runs on the other node, continues the run directory and completes."""
    done = run_cli(
        "submit",
        str(REPO / "tests" / "recipes" / "failing-rank.yaml"),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "resources.nodes=1",
        "--set",
        "launcher=python",
        "--set",
        "task.script=tests/scripts/die_once.py",
        "--set",
        "task.args=[]",
        "--set",
        "preemption.max_retries=1",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "failing-rank" / job_id
    wait(lambda: (run_dir / "retries.jsonl").exists(), 120, "the retry to be submitted")
    retry = json.loads((run_dir / "retries.jsonl").read_text())
    died_on = (run_dir / "died-on").read_text()
    assert retry == {
        "retry": 1,
        "job_id": retry["job_id"],
        "after_job": job_id,
        "excluded": died_on,
        "node": "0",
        "by": "supervisor",
    }
    assert scontrol(retry["job_id"]).get("ExcNodeList") == died_on
    status = wait_done(retry["job_id"], run_dir)
    assert "COMPLETED" in status and f"retry 1 as job {retry['job_id']}, excluding {died_on}" in status
    assert {(run_dir / f"ran-on-{rank}").read_text() for rank in (0, 1)} == {"node1", "node2"} - {died_on}
    assert "clusterkit: retry 1 of 1: job" in (run_dir / f"{job_id}_0_log.out").read_text()


def test_retries_stop_at_max_retries(dev_cluster: str, tmp_path: Path) -> None:
    """A run that fails every time is retried max_retries times (each a new job), then reported FAILED."""
    done = run_cli(
        "submit",
        str(REPO / "tests" / "recipes" / "failing-rank.yaml"),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "resources.nodes=1",
        "--set",
        "task.args=['1']",
        "--set",
        "preemption.max_retries=1",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "failing-rank" / job_id
    wait(lambda: (run_dir / "retries.jsonl").exists(), 120, "the first failure")
    retry = json.loads((run_dir / "retries.jsonl").read_text())
    status = wait_done(retry["job_id"], run_dir)
    assert "FAILED" in status and "deliberate failure on rank 1" in status
    assert len((run_dir / "retries.jsonl").read_text().splitlines()) == 1, "retried once, then no more"
    assert "clusterkit: retry" not in (run_dir / f"{retry['job_id']}_0_log.out").read_text()


def test_an_inherited_retry_variable_does_not_take_over_another_run(dev_cluster: str, tmp_path: Path) -> None:
    """A job submitted from inside a retried job inherits CLUSTERKIT_RETRY_OF (sbatch exports the
    environment): it must still run in its own directory, never write into that other run."""
    runs = tmp_path / "runs" / "failing-rank"
    earlier = runs / "4242"
    earlier.mkdir(parents=True)
    (earlier / "keep.txt").write_text("the user's")
    env = {**os.environ, "CLUSTERKIT_RETRY_OF": "4242", "CLUSTERKIT_RETRY": "1"}
    done = run_cli(
        "submit",
        str(REPO / "tests" / "recipes" / "failing-rank.yaml"),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "resources.nodes=1",
        "--set",
        "task.script=tests/scripts/echo_contract.py",
        "--set",
        "task.args=[]",
        "--follow",
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    assert sorted(p.name for p in earlier.iterdir()) == ["keep.txt"]
    records = [json.loads(p.read_text()) for p in (runs / job_id / "contract").glob("rank-*.json")]
    assert len(records) == 2 and {r["env"].get("CLUSTERKIT_RETRY_OF") for r in records} == {None}


def test_a_killed_supervisor_is_retried_once_by_clusterkit_watch(dev_cluster: str, tmp_path: Path) -> None:
    """The batch shell (the supervisor) of a long run is killed with SIGKILL after its first checkpoint:
    nothing in the job can retry it. `clusterkit watch --once`, run again and again from the login node
    (this machine), resubmits it exactly once, in the same run directory; the retry resumes from the
    checkpoint and completes."""
    job_id, run_dir = start(tmp_path, *LONG, "--set", "preemption.max_retries=1")
    # Complete (every rank's part written): a folder alone may be cut short by the kill below.
    wait((run_dir / CHECKPOINTS_DIR / checkpoint_name(100) / COMPLETE).exists, 300, "the first complete checkpoint")
    killed = subprocess.run(["scancel", "--batch", "--signal=KILL", job_id], capture_output=True, text=True)
    assert killed.returncode == 0, killed.stderr

    def watched() -> bool:
        done = run_cli("watch", "--once", str(run_dir), cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
        return (run_dir / "retries.jsonl").exists()

    wait(watched, 180, "clusterkit watch to resubmit the run")
    for _ in range(3):  # later passes follow the retry: nothing more
        watched()
    (retry,) = [json.loads(line) for line in (run_dir / "retries.jsonl").read_text().splitlines()]
    assert retry["after_job"] == job_id and retry["by"] == "watch" and retry["cause"] in ("FAILED", "CANCELLED")
    status = wait_done(retry["job_id"], run_dir, timeout=600)
    assert "COMPLETED" in status, status
    records = rank_records(run_dir)  # the retry's ranks, in the same run directory
    assert len({r["resumed_from"] for r in records}) == 1
    assert str(records[0]["resumed_from"]).startswith(str(run_dir / "checkpoints" / "checkpoint-"))
    assert (run_dir / "exit_code").read_text() == "0\n"

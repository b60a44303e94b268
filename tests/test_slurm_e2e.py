"""End to end on the real dev cluster (slurmctld + two slurmd), CPU, gloo: real sbatch/srun, real
torchrun and DeepSpeed launches of HF Trainer. Each test asserts what the job really did (world
size, distinct nodes, distinct batches, agreeing parameters, falling loss), not just its exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from slurm_jobs import TINY, assert_real_data_parallel, rank_records, submit

pytestmark = pytest.mark.slurm


def test_tiny_torchrun_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(tmp_path, TINY)
    assert rc == 0, output
    assert "slurm executor" in output and "COMPLETED" in output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    assert (run_dir / "checkpoints" / "checkpoint-30" / "trainer_state.json").is_file()
    assert (run_dir / "model" / "model.safetensors").is_file()
    assert (run_dir / "hostfile").read_text() == "node1 slots=2\nnode2 slots=2\n"
    for name in ("job.sbatch", "env.sh", "recipe.resolved.yaml", "run.json"):
        assert (run_dir / name).is_file(), name
    # status / logs / ls work from the run directory (the dev cluster has no sacct).
    job_id = run_dir.name
    status = run_cli("status", job_id, "--runs-dir", str(tmp_path / "runs"), cwd=REPO)
    assert f"{job_id}  tiny-gpt2  COMPLETED  exit 0" in status.stdout
    rank3 = run_cli("logs", str(run_dir), "--rank", "3", cwd=REPO)
    assert rank3.returncode == 0 and "attempt_0/1/std" in rank3.stdout
    listing = run_cli("ls", "--runs-dir", str(tmp_path / "runs"), cwd=REPO)
    assert job_id in listing.stdout and "COMPLETED" in listing.stdout


def test_tiny_deepspeed_zero2_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        "--set",
        "launcher=deepspeed",
        "--set",
        "parallelism.zero_stage=2",
        "--set",
        "task.trainer.args.max_steps=10",
        "--set",
        "task.trainer.args.save_steps=10",
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    assert json.loads((run_dir / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2
    assert list((run_dir / "ranks" / "node1").glob("*_rank3.log")), "DeepSpeed's per-rank logs"


def test_tiny_trainer_as_a_task_per_gpu_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    """launcher: python: srun starts the 4 ranks itself (no torchrun), each mapping SLURM's ids to
    RANK/LOCAL_RANK/WORLD_SIZE; the Trainer must still train one model data-parallel over both nodes."""
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        "--set",
        "launcher=python",
        "--set",
        "resources.cpus_per_task=1",
        "--set",
        "task.trainer.args.max_steps=10",
        "--set",
        "task.trainer.args.save_steps=10",
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    job_id = run_dir.name
    assert sorted(p.name for p in run_dir.glob(f"{job_id}_*_log.out")) == [
        f"{job_id}_{rank}_log.out" for rank in range(4)
    ]
    assert not list((run_dir / "ranks").glob("node*/*/attempt_*")), "no torchrun ran"


def test_single_node_ddp(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(
        tmp_path, TINY, "--set", "resources.nodes=1", "--set", "task.trainer.args.max_steps=10"
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=2, nodes={"node1"})


def test_user_script_env_contract(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(tmp_path, str(REPO / "tests" / "recipes" / "env-contract.yaml"))
    assert rc == 0, output
    seen = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert len(seen) == 4
    assert {s["node"] for s in seen} == {"node1", "node2"}
    assert sorted(int(s["env"]["RANK"]) for s in seen) == [0, 1, 2, 3]
    assert {s["env"]["WORLD_SIZE"] for s in seen} == {"4"}
    assert {s["env"]["MASTER_ADDR"] for s in seen} == {"node1"}
    assert all(s["argv"] == ["--flag", "value with spaces", f"{run_dir}/out"] for s in seen)


def test_dry_run_equals_what_sbatch_received(dev_cluster: str, tmp_path: Path) -> None:
    runs = f"runs_dir={tmp_path / 'runs'}"
    dry = run_cli("submit", TINY, "--dry-run", "--set", runs, cwd=REPO)
    assert dry.returncode == 0 and not (tmp_path / "runs").exists(), "a dry run submits and writes nothing"
    real = run_cli("submit", TINY, "--set", runs, "--set", "task.trainer.args.max_steps=2", cwd=REPO)
    assert real.returncode == 0, real.stderr
    job_id = real.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "tiny-gpt2" / job_id
    # What slurmctld holds as the job's batch script, byte for byte.
    submitted = subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True, check=True
    ).stdout
    expected = run_cli("submit", TINY, "--dry-run", "--set", runs, "--set", "task.trainer.args.max_steps=2", cwd=REPO)
    assert submitted == expected.stdout
    assert (run_dir / "job.sbatch").read_text() == submitted
    # And every other file of the request (the launch plan, job.json, the supervisor's code) as the
    # dry run listed it, byte for byte, in the run directory.
    listed = run_cli(
        "submit", TINY, "--dry-run", "--json", "--set", runs, "--set", "task.trainer.args.max_steps=2", cwd=REPO
    )
    files = json.loads(listed.stdout)["files"]
    assert {"plan.json", "job.json", "supervisor/__main__.py"} <= set(files)
    assert {name: (run_dir / name).read_text() for name in files} == files
    run_cli("cancel", job_id, "--runs-dir", str(tmp_path / "runs"), cwd=REPO)


def test_failing_rank_ends_the_job_promptly(dev_cluster: str, tmp_path: Path) -> None:
    started = time.time()
    rc, run_dir, output = submit(tmp_path, str(REPO / "tests" / "recipes" / "failing-rank.yaml"))
    elapsed = time.time() - started
    assert rc != 0 and "FAILED" in output
    assert elapsed < 300, (
        f"took {elapsed:.0f} s: the job waited for its 10-minute limit"
    )  # generous bound, not a timing
    status = run_cli("status", str(run_dir), cwd=REPO)
    assert "FAILED" in status.stdout
    assert "first failure: rank 3 (node 1, node2): RuntimeError: deliberate failure on rank 3" in status.stdout


def test_cancel_a_running_job(dev_cluster: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = run_cli("submit", TINY, "--set", f"runs_dir={runs}", "--set", "task.trainer.args.max_steps=100000", cwd=REPO)
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    cancel = run_cli("cancel", job_id, "--runs-dir", str(runs), cwd=REPO)
    assert cancel.returncode == 0 and f"cancelled job {job_id}" in cancel.stdout
    deadline = time.time() + 60
    while "CANCELLED" not in run_cli("status", job_id, "--runs-dir", str(runs), cwd=REPO).stdout:
        assert time.time() < deadline, "job not cancelled within 60 s"
        time.sleep(1)


def test_local_executor_without_slurm(tmp_path: Path) -> None:
    # A PATH with python but without sbatch: submit falls back to running the node launches here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "awk", "head", "tr", "mkdir", "rm", "cat", "env", "sh", "python3"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    env = dict(os.environ, PATH=str(bin_dir))
    rc, run_dir, output = submit(tmp_path, TINY, "--set", "task.trainer.args.max_steps=10", env=env)
    assert rc == 0, output
    assert "local executor" in output
    assert_real_data_parallel(run_dir, world=4, nodes={"127.0.0.1", "127.0.0.2"})


def test_tiny_trainer_under_accelerate_launch_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    """launcher: accelerate: one `accelerate launch` per node with the machine rank read there; the
    Trainer must train one model data-parallel over both nodes (world 4), not four alone."""
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        "--set",
        "launcher=accelerate",
        "--set",
        "task.trainer.args.max_steps=10",
        "--set",
        "task.trainer.args.save_steps=10",
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    rank3 = run_cli("logs", str(run_dir), "--rank", "3", cwd=REPO)
    assert rank3.returncode == 0 and "attempt_0/1/std" in rank3.stdout  # torchrun's per-rank logs, via accelerate


def test_tiny_trainer_under_open_mpi_mpirun_in_the_batch_shell_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    """launcher: mpirun: Open MPI's mpirun runs once in the batch shell, starts a daemon per node through
    srun and the 4 ranks under them; the task shim maps OMPI_COMM_WORLD_* (not the daemons' SLURM ids)
    to RANK & co. The Trainer must train one model data-parallel over both nodes, and each rank's own
    output is where `logs --rank` looks."""
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        "--set",
        "launcher=mpirun",
        "--set",
        "resources.cpus_per_task=1",
        "--set",
        "task.trainer.args.max_steps=10",
        "--set",
        "task.trainer.args.save_steps=10",
        # the dev cluster runs jobs as root, which Open MPI refuses unless told
        "--set",
        "env.OMPI_ALLOW_RUN_AS_ROOT=1",
        "--set",
        "env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    assert [r["local_rank"] for r in rank_records(run_dir)] == [0, 1, 0, 1]
    rank3 = run_cli("logs", str(run_dir), "--rank", "3", cwd=REPO)
    assert rank3.returncode == 0 and f"ranks/mpirun-{run_dir.name}/1/rank.3/stderr" in rank3.stdout


def test_tiny_deepspeed_launcher_in_the_batch_shell_two_nodes(dev_cluster: str, tmp_path: Path) -> None:
    """process_model: batch_launcher: DeepSpeed's launcher runs once in the batch shell and starts
    the 4 ranks with its own srun step (--launcher slurm); clusterkit's task shim maps each task's
    SLURM ids to RANK & co. The Trainer must train one model data-parallel over both nodes."""
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        "--set",
        "launcher=deepspeed",
        "--set",
        "process_model=batch_launcher",
        "--set",
        "resources.cpus_per_task=1",
        "--set",
        "task.trainer.args.max_steps=10",
        "--set",
        "task.trainer.args.save_steps=10",
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    job_id = run_dir.name
    assert sorted(p.name for p in run_dir.glob(f"{job_id}_*_log.out")) == [
        f"{job_id}_{rank}_log.out" for rank in range(4)
    ]

"""Python functions as jobs (clusterkit.submit_function / map_function, through submitit): on this
machine with submitit's local executor, and on the dev cluster (marked slurm). The run is a run like
any other (status, logs), and a result is unpickled only from a run directory that is ours alone."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import stat
import time
from pathlib import Path

import pytest
import submitit

import clusterkit
from clusterkit.errors import FunctionFailed
from clusterkit.runs.function_results import NotOurs, result_file
from clusterkit.schedulers.local_slurm import carries, processes_with
from conftest import REPO, run_cli

NOBODY = 65534


def double(x: int) -> int:
    return x * 2


def boom(word: str) -> None:
    print("about to fail", flush=True)
    raise ValueError(f"kaboom {word}")


def ranks() -> tuple:
    """Each task's rank from submitit's TorchDistributedEnvironment, and a gloo all_reduce of rank+1."""
    import submitit
    import torch
    import torch.distributed as dist

    env = submitit.helpers.TorchDistributedEnvironment().export()
    dist.init_process_group("gloo")
    total = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return env.rank, env.world_size, os.environ["RANK"], os.environ["LOCAL_RANK"], total.item()


class Resumable(submitit.helpers.Checkpointable):
    """Waits past its time limit on its first attempt; checkpointed (this object, pickled) and requeued
    by submitit, its second attempt returns at once."""

    def __init__(self) -> None:
        self.attempts = 0

    def __call__(self, word: str) -> tuple[str, int]:
        self.attempts += 1
        if self.attempts == 1:
            time.sleep(300)
        return word, self.attempts


# A value the job's environment must hold as it is: quotes, $(...), backticks, a line break.
HOSTILE = "a b$(touch /tmp/ck-fn-pwned)'\"`x`\\ ~%-;\n second line"


def recipe(tmp_path: Path, nodes: int = 1, gpus: int = 1, limit: str = "5") -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(
        f"name: tiny\nruns_dir: {tmp_path / 'runs'}\n"
        f"resources: {{nodes: {nodes}, gpus_per_node: {gpus}, time: '{limit}'}}\n"
        # the tests' functions, unpickled in the job
        f"env: {{PYTHONPATH: {REPO}:{REPO / 'tests'}, HOSTILE: {json.dumps(HOSTILE)}}}\n",
        encoding="utf-8",
    )
    return path


def hostile() -> str:
    return os.environ["HOSTILE"]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}


# --- this machine: submitit's LocalExecutor -------------------------------------------------------


def test_a_lambda_returns_its_value(tmp_path: Path) -> None:
    run = clusterkit.submit_function(lambda x: x * 2, 21, recipe=recipe(tmp_path), executor="local")
    assert run.result(timeout=120) == 42
    assert run.status().state == "COMPLETED"
    assert Path(run.run_dir).parent == tmp_path / "runs" / "tiny"
    assert stat.S_IMODE(os.stat(run.run_dir).st_mode) == 0o700


def test_the_recipes_env_reaches_the_function_as_written(tmp_path: Path) -> None:
    run = clusterkit.submit_function(hostile, recipe=recipe(tmp_path), executor="local")
    assert run.result(timeout=120) == HOSTILE
    assert not Path("/tmp/ck-fn-pwned").exists()


def test_keywords_go_to_the_function(tmp_path: Path) -> None:
    run = clusterkit.submit_function(lambda x, *, by: x * by, 7, recipe=recipe(tmp_path), executor="local", by=6)
    assert run.result(timeout=120) == 42


def test_a_raised_exception_comes_back_with_its_traceback_and_log_tail(tmp_path: Path) -> None:
    run = clusterkit.submit_function(boom, "now", recipe=recipe(tmp_path), executor="local")
    with pytest.raises(FunctionFailed) as raised:
        run.result(timeout=120)
    error = raised.value
    assert "ValueError: kaboom now" in str(error) and "\n" not in str(error)
    assert 'raise ValueError(f"kaboom {word}")' in error.remote_traceback
    assert "about to fail" in error.log_tail and f"{run.job_id}_0_log.out" in error.log_tail
    assert error.remote_traceback.rstrip("\n") in error.__notes__[0]
    status = run.status()
    assert (status.state, status.exit_code) == ("FAILED", 1)
    assert status.failure == "task 0 raised ValueError: kaboom now (Run.result() gives the whole traceback)"


def test_two_tasks_have_ranks_and_a_working_gloo_all_reduce(tmp_path: Path) -> None:
    run = clusterkit.submit_function(ranks, recipe=recipe(tmp_path, gpus=2), executor="local")
    assert run.results(timeout=180) == [(0, 2, "0", "0", 3.0), (1, 2, "1", "1", 3.0)]


def test_map_returns_each_call_in_order(tmp_path: Path) -> None:
    runs = clusterkit.map_function(double, [(1,), (2,), (3,), (4,)], recipe=recipe(tmp_path), executor="local")
    assert [run.result(timeout=120) for run in runs] == [2, 4, 6, 8]


def test_a_checkpointable_is_requeued_at_its_time_limit_and_resumes(tmp_path: Path) -> None:
    """submitit's Checkpointable: signalled before the 1-minute limit, checkpointed and requeued."""
    run = clusterkit.submit_function(Resumable(), "again", recipe=recipe(tmp_path, limit="1"), executor="local")
    assert run.result(timeout=240) == ("again", 2)
    assert "timed-out" in (Path(run.run_dir) / f"{run.job_id}_0_log.err").read_text()


def test_status_ls_and_logs_of_a_function_run(tmp_path: Path) -> None:
    run = clusterkit.submit_function(boom, "logged", recipe=recipe(tmp_path), executor="local")
    with pytest.raises(FunctionFailed):
        run.result(timeout=120)
    runs_dir = str(tmp_path / "runs")
    status = run_cli("status", run.job_id, "--runs-dir", runs_dir, env=cli_env())
    assert "FAILED" in status.stdout, status.stdout + status.stderr
    listed = run_cli("ls", "--runs-dir", runs_dir, env=cli_env())
    assert run.job_id in listed.stdout, listed.stdout + listed.stderr
    logs = run_cli("logs", run.job_id, "--runs-dir", runs_dir, env=cli_env())
    assert f"{run.job_id}_0_log.out" in logs.stdout and "about to fail" in logs.stdout
    assert "ValueError: kaboom logged" in logs.stdout, logs.stdout
    assert "about to fail" in run.logs(rank=0)


def test_cancel_ends_a_running_function_and_its_tasks(tmp_path: Path) -> None:
    run = clusterkit.submit_function(time.sleep, 300, recipe=recipe(tmp_path, gpus=2), executor="local")
    deadline = time.monotonic() + 60
    while len(processes_with((f"SUBMITIT_LOCAL_JOB_ID={run.job_id}",))) < 2:
        assert time.monotonic() < deadline, "the two tasks did not start"
        time.sleep(0.2)
    done = run_cli("cancel", run.job_id, "--runs-dir", str(tmp_path / "runs"), env=cli_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert run.status().state == "CANCELLED"
    assert not processes_with((f"SUBMITIT_LOCAL_JOB_ID={run.job_id}",)), "no task is left behind"
    assert not carries(int(run.job_id), ("SUBMITIT_EXECUTOR=local",)), "the controller has ended"


def _finished(tmp_path: Path) -> clusterkit.Run:
    run = clusterkit.submit_function(double, 21, recipe=recipe(tmp_path), executor="local")
    assert run.result(timeout=120) == 42
    return run


def test_a_run_found_again_by_its_job_id_gives_its_value(tmp_path: Path) -> None:
    """In a new kernel: find_run, then result(); a run that is no function's has none, said in one line."""
    run = _finished(tmp_path)
    assert clusterkit.find_run(run.job_id, tmp_path / "runs").result(timeout=10) == 42
    other = clusterkit.Run(dataclasses.replace(run.record, launcher="torchrun"))
    with pytest.raises(clusterkit.UsageError, match=f"job {run.job_id} is not a function's run"):
        other.result(timeout=10)


def _planted(path: Path, marker: Path) -> None:
    """A pickle that, unpickled, would create ``marker``."""

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path.write_bytes(pickle.dumps(("success", Payload())))


def test_a_result_someone_else_owns_is_never_unpickled(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    marker = tmp_path / "pwned"
    result = result_file(run.record, 0)
    _planted(result, marker)
    os.chown(result, NOBODY, NOBODY)
    with pytest.raises(NotOurs, match="belongs to uid 65534"):
        run.result(timeout=10)
    assert not marker.exists()


def test_a_run_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    os.chmod(run.run_dir, 0o770)
    with pytest.raises(NotOurs, match="others can write this folder"):
        run.result(timeout=10)
    os.chmod(run.run_dir, 0o700)
    os.chmod(result_file(run.record, 0), 0o666)
    with pytest.raises(NotOurs, match="others can write this result file"):
        run.result(timeout=10)


def test_no_function_is_submitted_from_a_folder_others_can_write(tmp_path: Path) -> None:
    base = tmp_path / "runs" / "tiny"
    base.mkdir(parents=True)
    os.chmod(base, 0o777)  # anyone could swap the function's pickle before the job reads it
    with pytest.raises(NotOurs, match="others can write this folder"):
        clusterkit.submit_function(double, 1, recipe=recipe(tmp_path), executor="local")
    assert list(base.iterdir()) == []


def test_what_submitit_writes_is_private_from_the_start(tmp_path: Path) -> None:
    before = os.umask(0o022)
    os.umask(before)
    run = _finished(tmp_path)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in Path(run.run_dir).iterdir()}
    submitits = {name: mode for name, mode in modes.items() if name != "run.json"}  # the record: as every run's
    assert len(submitits) == 4 and all(mode & 0o077 == 0 for mode in submitits.values()), modes
    after = os.umask(before)
    assert after == before, "the caller's umask is given back"


def test_a_link_or_a_fifo_in_place_of_the_result_is_refused(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    result = result_file(run.record, 0)
    elsewhere = tmp_path / "elsewhere.pkl"
    _planted(elsewhere, tmp_path / "pwned")
    result.unlink()
    result.symlink_to(elsewhere)
    with pytest.raises(NotOurs, match="not a result file"):
        run.result(timeout=10)
    result.unlink()
    os.mkfifo(result)
    with pytest.raises(NotOurs, match="not a result file"):
        run.result(timeout=10)  # refused at once: nothing opens the FIFO and blocks
    assert not (tmp_path / "pwned").exists()


def test_sbatch_refusing_the_job_is_a_submit_error(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid account or account/partition' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    with pytest.raises(clusterkit.SubmitError, match="submitit could not submit.*Invalid account") as raised:
        clusterkit.submit_function(double, 1, recipe=recipe(tmp_path), executor="slurm")
    assert "\n" not in str(raised.value)
    assert list((tmp_path / "runs" / "tiny").iterdir()) == [], "submitit's staged pickle and script are removed"


def test_the_ssh_executor_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        clusterkit.UsageError, match="^executor: ssh: submit_function submits with this machine's sbatch"
    ):
        clusterkit.submit_function(double, 1, recipe=recipe(tmp_path), executor="ssh")
    assert not (tmp_path / "runs").exists()


def test_an_unknown_executor_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(clusterkit.UsageError, match="executor: 'ssh-ish'"):
        clusterkit.submit_function(double, 1, recipe=recipe(tmp_path), executor="ssh-ish")


def test_submit_resume_of_a_function_run_is_refused(tmp_path: Path) -> None:
    run = _finished(tmp_path)
    done = run_cli("submit", "--resume", run.run_dir, "--executor", "local", env=cli_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "resumes through submitit's Checkpointable, not --resume" in done.stderr
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny").iterdir() if p.name != "%j") == [run.job_id]


# --- the dev cluster (bin/dev-cluster up) ---------------------------------------------------------


@pytest.fixture
def on_slurm(dev_cluster: str, tmp_path: Path):
    """submit_function on the dev cluster; every job still queued or running at the end is cancelled."""
    submitted: list[clusterkit.Run] = []

    def submit(fn, *args, nodes: int = 1, gpus: int = 1):
        run = clusterkit.submit_function(fn, *args, recipe=recipe(tmp_path, nodes, gpus), executor="slurm")
        submitted.append(run)
        return run

    yield submit
    for run in submitted:
        run.cancel()


@pytest.mark.slurm
def test_dev_cluster_a_lambda_returns_42(on_slurm, tmp_path: Path) -> None:
    run = on_slurm(lambda x: x * 2, 21)
    assert run.result(timeout=300) == 42
    assert run.record.scheduler == "slurm" and run.status().state == "COMPLETED"
    quoted = on_slurm(hostile)
    assert quoted.result(timeout=300) == HOSTILE and not Path("/tmp/ck-fn-pwned").exists()


@pytest.mark.slurm
def test_dev_cluster_a_raised_exception_with_status_and_logs(on_slurm, tmp_path: Path) -> None:
    run = on_slurm(boom, "on slurm")
    with pytest.raises(FunctionFailed) as raised:
        run.result(timeout=300)
    assert "ValueError: kaboom on slurm" in str(raised.value) and "about to fail" in raised.value.log_tail
    runs_dir = str(tmp_path / "runs")
    status = run_cli("status", run.job_id, "--runs-dir", runs_dir, env=cli_env())
    assert "FAILED" in status.stdout, status.stdout + status.stderr
    logs = run_cli("logs", run.job_id, "--runs-dir", runs_dir, env=cli_env())
    assert "ValueError: kaboom on slurm" in logs.stdout, logs.stdout + logs.stderr


@pytest.mark.slurm
def test_dev_cluster_two_nodes_of_two_tasks(on_slurm, tmp_path: Path) -> None:
    run = on_slurm(ranks, nodes=2, gpus=2)
    found = run.results(timeout=300)
    assert [(rank, world, env_rank) for rank, world, env_rank, _, _ in found] == [(r, 4, str(r)) for r in range(4)]
    assert [local for *_, local, _ in found] == ["0", "1", "0", "1"]
    assert {total for *_, total in found} == {10.0}  # 1+2+3+4 summed over gloo across both nodes


@pytest.mark.slurm
def test_dev_cluster_an_array_of_four_in_order(dev_cluster: str, tmp_path: Path) -> None:
    runs = clusterkit.map_function(double, [(1,), (2,), (3,), (4,)], recipe=recipe(tmp_path), executor="slurm")
    try:
        assert len({run.job_id.split("_")[0] for run in runs}) == 1  # one SLURM job array
        assert [run.result(timeout=300) for run in runs] == [2, 4, 6, 8]
    finally:
        for run in runs:
            run.cancel()

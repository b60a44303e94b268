"""Checkpoints and the end of a rank: rotation never leaves a run without a complete checkpoint (a
real 2-rank torchrun run polled every few ms), a damaged newest checkpoint falls back to the previous
one, --resume refuses a run with nothing to resume, export only uses complete intact checkpoints, and
a finished rank's exit path loses no output while a failing rank still leaves torchrun's error file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from clusterkit import load_recipe
from clusterkit.runs.checkpoint_files import complete_checkpoints, damage, newest_usable, rotate
from clusterkit.runs.record import RunRecord
from clusterkit.spec.layout import COMPLETE, LATEST
from conftest import REPO, run_cli

torch = pytest.importorskip("torch")
from clusterkit.runtime.checkpoints import prepare_own_dir, resume_point  # noqa: E402

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
TINY_MODEL = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 64}


def _checkpoint(directory: Path, step: int, complete: bool = True) -> Path:
    """A real checkpoint as the Trainer writes one (model, optimizer state, trainer state)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = directory / f"checkpoint-{step}"
    settings = dict(TINY_MODEL)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))
    model.save_pretrained(str(path))
    torch.save({"state": {0: {"exp_avg": torch.ones(8)}}}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        (path / COMPLETE).write_text(f"{step}\n")
    return path


def _truncate(path: Path, keep: int) -> None:
    with path.open("r+b") as stream:
        stream.truncate(keep)


# --- files: what is intact, rotation ---------------------------------------------------------


def test_damage_names_the_broken_file(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, 5)
    assert damage(checkpoint) is None
    size = (checkpoint / "model.safetensors").stat().st_size
    _truncate(checkpoint / "model.safetensors", size - 1)
    assert damage(checkpoint) == f"{checkpoint / 'model.safetensors'}: truncated: {size - 1} of {size} bytes"
    for name, cut in (("optimizer.pt", 40), ("trainer_state.json", 5), ("config.json", 0)):
        checkpoint = _checkpoint(tmp_path, 10)
        _truncate(checkpoint / name, cut)
        problem = damage(checkpoint)
        assert problem is not None and problem.startswith(f"{checkpoint / name}: "), (name, problem)
    checkpoint = _checkpoint(tmp_path, 15)
    (checkpoint / "trainer_state.json").unlink()
    assert damage(checkpoint) == f"{checkpoint / 'trainer_state.json'}: missing"


def test_rotate_keeps_the_newest_complete_and_the_best(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / COMPLETE).write_text("")
    (tmp_path / "checkpoint-5").mkdir()  # being written: not complete, never touched
    removed = rotate(tmp_path, keep=1, protected=tmp_path / "checkpoint-2")
    assert sorted(p.name for p in removed) == ["checkpoint-1", "checkpoint-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    assert rotate(tmp_path, keep=0) == [tmp_path / "checkpoint-2"], "the newest complete one always stays"
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-4"]


# --- resume ----------------------------------------------------------------------------------


def test_resume_falls_back_past_a_damaged_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    earlier = tmp_path / "earlier" / "checkpoints"
    good = _checkpoint(earlier, 5)
    broken = _checkpoint(earlier, 10)
    _truncate(broken / "model.safetensors", 100)
    own = tmp_path / "own" / "checkpoints"
    assert resume_point(own, str(earlier.parent), report=True) == good
    log = capsys.readouterr().out
    assert f"not resuming from {broken}: {broken / 'model.safetensors'}: truncated" in log
    assert broken.is_dir(), "another run's checkpoint is left as it is"
    # The run's own damaged checkpoint is moved aside (kept), so step 10 can be written again.
    own_good = _checkpoint(own, 5)
    own_broken = _checkpoint(own, 10)
    (own_broken / "trainer_state.json").write_text("{not json")
    _checkpoint(own, 15, complete=False)
    prepare_own_dir(own)
    log = capsys.readouterr().out
    assert f"removed incomplete checkpoint {own / 'checkpoint-15'}" in log
    assert f"checkpoint {own_broken} is damaged ({own_broken / 'trainer_state.json'}: unreadable JSON" in log
    assert not own_broken.exists() and len(list(own.glob("checkpoint-10.damaged-*"))) == 1
    assert resume_point(own, str(earlier.parent), report=True) == own_good


def test_resume_from_a_run_without_a_usable_checkpoint_fails_in_the_job(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier"
    _checkpoint(earlier / "checkpoints", 5, complete=False)
    with pytest.raises(FileNotFoundError, match="no complete, intact checkpoint"):
        resume_point(tmp_path / "own", str(earlier), report=False)
    assert resume_point(tmp_path / "own", None, report=False) is None, "a new run starts at step 0"


def _earlier_run(tmp_path: Path, job_id: str = "41") -> Path:
    run_dir = tmp_path / "runs" / "tiny-gpt2" / job_id
    run_dir.mkdir(parents=True)
    RunRecord(
        job_id=job_id,
        name="tiny-gpt2",
        scheduler="slurm",
        run_dir=str(run_dir),
        recipe=str(TINY),
        submitted_at=time.time(),
        nodes=2,
        ranks_per_node=2,
        launcher="torchrun",
    ).write()
    return run_dir


def test_submit_resume_refuses_a_run_with_nothing_to_resume(tmp_path: Path) -> None:
    run_dir = _earlier_run(tmp_path)
    _checkpoint(run_dir / "checkpoints", 15, complete=False)
    new_runs = tmp_path / "new-runs"
    done = run_cli("submit", "--resume", str(run_dir), "--set", f"runs_dir={new_runs}", cwd=REPO)
    assert done.returncode == 2 and done.stdout == "" and not new_runs.exists(), done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and str(run_dir) in done.stderr and "--from-scratch" in done.stderr
    # Only damaged complete checkpoints: refused too, naming the broken file.
    (run_dir / "checkpoints" / "checkpoint-15" / COMPLETE).write_text("15\n")
    _truncate(run_dir / "checkpoints" / "checkpoint-15" / "optimizer.pt", 10)
    done = run_cli("submit", "--resume", str(run_dir), "--dry-run", cwd=REPO)
    assert done.returncode == 2 and "optimizer.pt" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    scratch = run_cli("submit", "--resume", str(run_dir), "--from-scratch", "--dry-run", cwd=REPO)
    assert scratch.returncode == 0 and "again from step 0" in scratch.stderr, scratch.stderr
    request = json.loads(
        run_cli("submit", "--resume", str(run_dir), "--from-scratch", "--dry-run", "--json", cwd=REPO).stdout
    )
    assert '"resume_from": null' in request["files"]["job.json"]
    good = _checkpoint(run_dir / "checkpoints", 10)
    resumed = run_cli("submit", "--resume", str(run_dir), "--dry-run", "--json", cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr
    assert f'"resume_from": "{run_dir}"' in json.loads(resumed.stdout)["files"]["job.json"]
    assert good.is_dir()
    hostile = _earlier_run(tmp_path, "4\n2\x1b[31m")
    done = run_cli("submit", "--resume", str(hostile), "--dry-run", cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "\x1b" not in done.stderr, done.stderr
    assert "4\\n2\\x1b[31m" in done.stderr
    alone = run_cli("submit", str(TINY), "--from-scratch", "--dry-run", cwd=REPO)
    assert alone.returncode == 2 and "--from-scratch goes with --resume" in alone.stderr


# --- export ----------------------------------------------------------------------------------


def test_export_uses_only_complete_intact_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    out = tmp_path / "out"

    def export(*extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli("export", str(run_dir), "-o", str(out), *extra, cwd=REPO)

    for setup in (lambda: None, lambda: _checkpoint(run_dir / "checkpoints", 20, complete=False)):
        setup()
        done = export()
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "no complete, intact checkpoint" in done.stderr and not out.exists()
    torn = export("--checkpoint", str(run_dir / "checkpoints" / "checkpoint-20"))
    assert torn.returncode == 2 and "not a complete checkpoint" in torn.stderr and torn.stderr.count("\n") == 1
    good = _checkpoint(run_dir / "checkpoints", 10)
    damaged = _checkpoint(run_dir / "checkpoints", 15)
    _truncate(damaged / "model.safetensors", 64)
    named = export("--checkpoint", str(damaged))
    assert named.returncode == 2 and "model.safetensors: truncated" in named.stderr and not out.exists()
    done = export()
    assert done.returncode == 0, done.stderr
    assert f"skipping {damaged}: {damaged / 'model.safetensors'}: truncated" in done.stderr
    assert f"exported {good} to {out}/" in done.stdout and (out / "model.safetensors").is_file()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_export_never_overwrites_a_folder_it_did_not_write(tmp_path: Path) -> None:
    """-o a folder of the user's own (their model, their notes): refused in one line, every byte kept;
    an earlier export is replaced whole; an empty folder is filled in place; a render is no export."""
    run_dir = tmp_path / "run"
    _checkpoint(run_dir / "checkpoints", 10)
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    (mine / "model.safetensors").write_bytes(b"my weights")
    before = _tree(mine)
    done = run_cli("export", str(run_dir), "-o", str(mine), cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "is not empty and is not an earlier clusterkit export" in done.stderr
    assert _tree(mine) == before and sorted(p.name for p in tmp_path.iterdir()) == ["my-model", "run"]

    out = tmp_path / "out"
    for _ in range(2):  # the second replaces the first
        done = run_cli("export", str(run_dir), "-o", str(out), cwd=REPO)
        assert done.returncode == 0, done.stderr
    assert {"config.json", "model.safetensors", ".clusterkit-export"} <= set(os.listdir(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-model", "out", "run"], "no staging or old folder left"
    (out / "notes.txt").write_text("mine")
    done = run_cli("export", str(run_dir), "-o", str(out), cwd=REPO)
    assert done.returncode == 2 and "notes.txt" in done.stderr and (out / "notes.txt").read_text() == "mine"

    empty = tmp_path / "empty"
    empty.mkdir()
    inode = empty.stat().st_ino
    assert run_cli("export", str(run_dir), "-o", ".", cwd=empty).returncode == 0
    assert (empty / "model.safetensors").is_file() and empty.stat().st_ino == inode

    rendered = tmp_path / "rendered"
    assert run_cli("render", str(TINY), "-o", str(rendered), cwd=REPO).returncode == 0
    before = _tree(rendered)
    done = run_cli("export", str(run_dir), "-o", str(rendered), cwd=REPO)
    assert done.returncode == 2 and "not an earlier clusterkit export" in done.stderr and _tree(rendered) == before
    done = run_cli("render", str(TINY), "-o", str(out), cwd=REPO)
    assert done.returncode == 2 and "not an earlier clusterkit render" in done.stderr


# --- a rank's end ----------------------------------------------------------------------------

_FINISHING_RANK = """
import atexit, ctypes, pathlib, sys, threading, time
from clusterkit.runtime.rank_exit import finish
out = pathlib.Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
sys.stdout.write("python-buffered ")
ctypes.CDLL(None).printf(b"c-buffered")
finish(7)
"""


def test_finish_exits_with_its_code_and_loses_no_output(tmp_path: Path) -> None:
    with (tmp_path / "stdout").open("w") as stdout:  # a file: both stdio layers buffer fully
        done = subprocess.run(
            [sys.executable, "-c", _FINISHING_RANK, str(tmp_path)], stdout=stdout, cwd=REPO, timeout=60
        )
    assert done.returncode == 7
    assert (tmp_path / "stdout").read_text() == "python-buffered c-buffered"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


_RANK_WITH_A_THREAD_POOL = """
import concurrent.futures, pathlib, sys, time
from clusterkit.runtime.rank_exit import finish
out = pathlib.Path(sys.argv[1])
# torch.compile's inductor leaves such a pool behind after compiling; its workers wait for more work
pool = concurrent.futures.ThreadPoolExecutor(2)
assert pool.submit(lambda: 41 + 1).result() == 42
pool.submit(lambda: (time.sleep(0.3), (out / "queued").write_text("done")))  # still running at finish
finish(5)
"""


def test_finish_ends_a_rank_that_holds_an_idle_thread_pool(tmp_path: Path) -> None:
    """Seen rehearsing bench/gpu: a torch_compile run trained, saved, and then hung in finish until
    its time limit (it joined the pool's workers before anything told them to stop)."""
    done = subprocess.run(
        [sys.executable, "-c", _RANK_WITH_A_THREAD_POOL, str(tmp_path)],
        cwd=REPO,
        timeout=30,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 5, done.stderr
    assert (tmp_path / "queued").read_text() == "done"  # work already handed to the pool still finishes


def _local_job(tmp_path: Path, *overrides: str) -> Path:
    """job.json for one node with 2 ranks, as the batch script writes it."""
    loaded = load_recipe(TINY, ["resources.nodes=1", *overrides])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = {"recipe": msgspec.to_builtins(loaded.recipe), "profile": msgspec.to_builtins(loaded.profile)}
    (run_dir / "job.json").write_text(json.dumps(job))
    return run_dir / "job.json"


def _torchrun(job_file: Path) -> subprocess.Popen[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            f"--log-dir={job_file.parent / 'logs'}",
            "-m",
            "clusterkit.runtime.runner",
            str(job_file),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rotation_never_leaves_the_run_without_a_complete_checkpoint(tmp_path: Path) -> None:
    job_file = _local_job(
        tmp_path,
        "task.trainer.args.max_steps=12",
        "task.trainer.args.save_steps=1",
        "task.trainer.args.save_total_limit=1",
        "task.trainer.args.logging_steps=1",
    )
    checkpoints = job_file.parent / "checkpoints"
    counts: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            counts.append(len(complete_checkpoints(checkpoints)))
            time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        launch = _torchrun(job_file)
        output, _ = launch.communicate(timeout=300)
    finally:
        stop.set()
        poller.join()
    assert launch.returncode == 0, output
    first = counts.index(1)
    assert len(counts) - first > 100, "the poller sampled the saves"
    assert min(counts[first:]) >= 1, f"no complete checkpoint at {counts[first:].count(0)} polls"
    assert [p.name for p in complete_checkpoints(checkpoints)] == ["checkpoint-12"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-12", LATEST]
    assert (checkpoints / LATEST).read_text() == "checkpoint-12\n"
    assert newest_usable(checkpoints) == (checkpoints / "checkpoint-12", [])
    records = [json.loads(p.read_text()) for p in sorted((job_file.parent / "ranks").glob("rank-*.json"))]
    assert [r["global_step"] for r in records] == [12, 12]


def test_a_failing_rank_still_leaves_its_error_file(tmp_path: Path) -> None:
    nothing = tmp_path / "nothing-to-resume"
    nothing.mkdir()
    job_file = _local_job(tmp_path, f"resume_from={nothing}", "task.trainer.args.max_steps=2")
    launch = _torchrun(job_file)
    output, _ = launch.communicate(timeout=300)
    assert launch.returncode != 0, output
    errors = sorted((job_file.parent / "logs").rglob("error.json"))
    assert len(errors) == 2, output
    message = json.loads(errors[0].read_text())["message"]
    assert "no complete, intact checkpoint" in json.dumps(message)
    assert not (job_file.parent / "ranks").exists()

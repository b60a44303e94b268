"""profile: kind torch, for real: the built-in runner trains a tiny GPT-2 on CPU in this process (one
rank) and records the steps asked for. Some job files here hold what validation refuses (a rank the
job does not have, steps after max_steps): the runner must still say what it did, never fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from clusterkit import load_recipe
from clusterkit.spec import layout
from conftest import RECIPES, REPO

pytestmark = pytest.mark.train
pytest.importorskip("torch")


def _job(tmp_path: Path, profile: dict, max_steps: int = 6, ranks: int = 1) -> Path:
    loaded = load_recipe(
        RECIPES / "tiny-gpt2-cpu.yaml",
        [
            "resources.nodes=1",
            f"resources.gpus_per_node={ranks}",
            f"task.trainer.args.max_steps={max_steps}",
            "task.trainer.args.save_steps=100",
        ],
    )
    recipe = msgspec.to_builtins(loaded.recipe)
    recipe["profile"] = profile  # as written, past validation
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job_file = run_dir / layout.JOB_JSON
    job_file.write_text(json.dumps({"recipe": recipe, "profile": msgspec.to_builtins(loaded.profile)}))
    return job_file


def _train(job_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One rank, as torchrun would start it; returns the run's profile folder."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    from clusterkit.runtime.train import main

    assert main(job_file) == 0
    return job_file.parent / layout.PROFILE_DIR


def _steps_in(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})


def test_steps_2_to_4_of_6_are_a_chrome_trace_and_a_table(tmp_path: Path, monkeypatch, capsys) -> None:
    folder = _train(_job(tmp_path, {"kind": "torch", "ranks": [0], "steps": "2-4"}), monkeypatch)
    trace = folder.parent / layout.profile_trace(0, 2, 4)
    table = folder.parent / layout.profile_table(0, 2, 4)
    assert sorted(p.name for p in folder.iterdir()) == sorted([trace.name, table.name])  # no staging file left
    assert _steps_in(trace) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert "aten::mm" in table.read_text() and "Self CPU" in table.read_text()
    assert f"clusterkit: profile: rank 0: steps 2-4 written to {trace}" in capsys.readouterr().out


def test_training_that_ends_exactly_at_the_last_step_writes_its_trace(tmp_path: Path, monkeypatch) -> None:
    folder = _train(_job(tmp_path, {"kind": "torch", "ranks": [0], "steps": 6}), monkeypatch)
    assert _steps_in(folder.parent / layout.profile_trace(0, 6, 6)) == ["ProfilerStep#6"]


def test_training_that_ends_before_the_first_step_writes_nothing_and_says_so(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = _train(_job(tmp_path, {"kind": "torch", "ranks": [0], "steps": "8-9"}), monkeypatch)
    assert not folder.exists()
    out = capsys.readouterr().out
    assert "clusterkit: profile: rank 0: nothing recorded: this run's steps ended at 6, before steps 8-9" in out


def test_a_rank_not_listed_records_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    folder = _train(_job(tmp_path, {"kind": "torch", "ranks": [1], "steps": "2-3"}), monkeypatch)
    assert not folder.exists()
    out = capsys.readouterr().out
    assert "clusterkit: profile: ranks [1] are not in this run (1 ranks): nothing is recorded there" in out
    assert "rank 0:" not in out


def test_two_ranks_only_the_listed_one_records(tmp_path: Path) -> None:
    """torchrun starts both ranks as a job does: rank 1 writes its trace, rank 0 nothing."""
    job_file = _job(tmp_path, {"kind": "torch", "ranks": [1], "steps": "2-3"}, max_steps=3, ranks=2)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
        + ["clusterkit.runtime.runner", str(job_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    folder = job_file.parent / layout.PROFILE_DIR
    trace = job_file.parent / layout.profile_trace(1, 2, 3)
    assert sorted(p.name for p in folder.iterdir()) == sorted([trace.name, Path(layout.profile_table(1, 2, 3)).name])
    assert _steps_in(trace) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert "clusterkit: profile: rank 1: steps 2-3 written to" in done.stdout
    assert "rank 0:" not in done.stdout

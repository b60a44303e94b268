"""Stragglers from the ranks' step-time files (clusterkit.supervisor.stragglers), with what a run
directory really holds: ranks missing, a line cut short by a rank that died mid-write, NaN and
negative times, a rank that restarted from a checkpoint, one rank alone, a FIFO where a file belongs.
And `clusterkit status` showing the straggler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clusterkit.spec import layout
from clusterkit.supervisor.stragglers import (
    DEFAULT_THRESHOLD,
    find_straggler,
    parse_steps,
    read_step_times,
    straggler,
)


def _write(run_dir: Path, rank: int, times: dict[int, float], data_s: float = 0.0, tail: str = "") -> Path:
    path = run_dir / layout.step_times(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps({"step": step, "step_s": t, "data_s": data_s, "time": 1e9 + step}) + "\n"
        for step, t in times.items()
    )
    path.write_text(lines + tail)
    return path


def _steps(first: int, last: int, seconds: float) -> dict[int, float]:
    return {step: seconds for step in range(first, last + 1)}


def test_the_slow_rank_and_its_node_are_named(tmp_path: Path) -> None:
    for rank in range(4):
        _write(tmp_path, rank, _steps(1, 19, 1.0))
    _write(tmp_path, 3, _steps(1, 19, 1.0) | _steps(10, 19, 1.42))
    found = straggler(tmp_path, ranks_per_node=2, hosts=["a", "b"])
    assert found is not None
    assert found.summary == "rank 3 on node1 (b) is 42% slower than the median step (1.42 s vs 1.00 s over steps 10-19)"
    assert found.to_json()["slower"] == 0.42 and found.to_json()["node"] == 1


def test_data_wait_counts_as_the_ranks_own_time(tmp_path: Path) -> None:
    """A rank slow to read its data: its step_s is shorter (its peers waited for it) but data_s is long."""
    _write(tmp_path, 0, _steps(1, 10, 1.0), data_s=0.01)
    _write(tmp_path, 1, _steps(1, 10, 0.7), data_s=0.9)
    _write(tmp_path, 2, _steps(1, 10, 1.0), data_s=0.01)
    found = straggler(tmp_path, ranks_per_node=1)
    assert found is not None and found.rank == 1 and found.node == 1 and found.host is None


def test_within_the_threshold_no_straggler(tmp_path: Path) -> None:
    _write(tmp_path, 0, _steps(1, 10, 1.0))
    _write(tmp_path, 1, _steps(1, 10, 1.0))
    _write(tmp_path, 2, _steps(1, 10, 1.0 + DEFAULT_THRESHOLD - 0.01))
    assert straggler(tmp_path, ranks_per_node=1) is None
    assert straggler(tmp_path, ranks_per_node=1, threshold=0.1) is not None


def test_a_few_slow_steps_are_not_a_straggler() -> None:
    """A checkpoint save or a GC pause: slow steps, but not most of the window."""
    times = {0: _steps(1, 10, 1.0), 1: _steps(1, 10, 1.0), 2: _steps(1, 10, 1.0) | {4: 9.0, 8: 9.0}}
    assert find_straggler(times, ranks_per_node=1) is None


def test_too_few_common_steps_or_one_rank_say_nothing(tmp_path: Path) -> None:
    assert find_straggler({0: _steps(1, 4, 1.0), 1: _steps(1, 4, 3.0)}, ranks_per_node=1) is None
    # steps 1-20 against 16-30: only 5 in common, just enough
    assert find_straggler({0: _steps(1, 20, 1.0), 1: _steps(16, 30, 3.0), 2: _steps(1, 30, 1.0)}, 1).first_step == 16
    assert find_straggler({0: _steps(1, 20, 1.0), 1: _steps(17, 30, 3.0), 2: _steps(1, 30, 1.0)}, 1) is None
    _write(tmp_path, 0, _steps(1, 50, 5.0))
    assert straggler(tmp_path, ranks_per_node=1) is None  # a single rank
    assert straggler(tmp_path / "nowhere", ranks_per_node=1) is None
    assert find_straggler({}, ranks_per_node=1) is None
    assert find_straggler({0: _steps(1, 9, 0.0), 1: _steps(1, 9, 0.0)}, ranks_per_node=1) is None  # no division by 0


def test_missing_ranks_are_left_out_not_an_error(tmp_path: Path) -> None:
    """Rank 1 never wrote (it died early, or its node has no shared disk): the others are compared."""
    for rank in (0, 2, 3):
        _write(tmp_path, rank, _steps(1, 10, 2.0 if rank == 3 else 1.0))
    found = straggler(tmp_path, ranks_per_node=2)
    assert found is not None and (found.rank, found.node) == (3, 1)


def test_damaged_lines_are_skipped(tmp_path: Path) -> None:
    bad = [
        '{"step": 11, "step_s": NaN, "data_s": 0}',
        '{"step": 12, "step_s": -3.0, "data_s": 0}',
        '{"step": 13, "step_s": Infinity, "data_s": 0}',
        '{"step": 14, "step_s": true, "data_s": 0}',
        '{"step": "15", "step_s": 1.0}',
        '{"step": 16, "step_s": 1.0, "data_s": -1}',
        "[1, 2]",
        "\x00\x01 not json",
        '{"step": -1, "step_s": 1.0}',
    ]
    assert parse_steps("\n".join(bad)) == {}
    _write(tmp_path, 0, _steps(1, 10, 1.0))
    _write(tmp_path, 1, _steps(1, 10, 1.0))
    # a rank that died mid-write: the last line is cut short (no newline), and a step before is NaN
    _write(tmp_path, 2, _steps(1, 10, 3.0), tail='{"step": 11, "step_s": 3.0, "da')
    assert 11 not in read_step_times(tmp_path)[2]
    found = straggler(tmp_path, ranks_per_node=1)
    assert found is not None and found.rank == 2 and found.last_step == 10


def test_a_restarted_rank_counts_its_newest_run(tmp_path: Path) -> None:
    """The job resumed from the checkpoint at step 5: steps 6-10 appear twice; the later lines win."""
    _write(tmp_path, 0, _steps(1, 10, 1.0) | _steps(6, 12, 1.0))
    path = _write(tmp_path, 1, _steps(1, 10, 5.0))
    with path.open("a") as out:  # after the restart the rank is well again
        out.writelines(json.dumps({"step": s, "step_s": 1.0, "data_s": 0.0}) + "\n" for s in range(6, 13))
    _write(tmp_path, 2, _steps(1, 12, 1.0))
    assert read_step_times(tmp_path)[1][8] == 1.0
    assert straggler(tmp_path, ranks_per_node=1) is None


def test_only_the_tail_of_a_long_file_is_read(tmp_path: Path) -> None:
    """A long run: the files are read from their end (a bounded read), from the first whole line."""
    _write(tmp_path, 0, _steps(1, 20_000, 1.0))
    _write(tmp_path, 1, _steps(1, 20_000, 2.0))
    assert (tmp_path / layout.step_times(0)).stat().st_size > 1_000_000
    times = read_step_times(tmp_path)
    assert 1 not in times[0] and 20_000 in times[0] and all(v == 1.0 for v in times[0].values())
    found = straggler(tmp_path, ranks_per_node=1)  # two ranks: the median is their mean, 1.5 s
    assert found is not None and (found.rank, found.first_step, found.last_step) == (1, 19_991, 20_000)
    assert found.summary.startswith("rank 1 on node1 is 33% slower")


def test_a_fifo_or_a_link_is_not_read(tmp_path: Path) -> None:
    _write(tmp_path, 0, _steps(1, 10, 1.0))
    _write(tmp_path, 1, _steps(1, 10, 1.0))
    fifo = tmp_path / layout.step_times(2)
    os.mkfifo(fifo)  # would block a plain open()
    secret = tmp_path / "elsewhere.jsonl"
    _write(tmp_path, 9, _steps(1, 10, 9.0)).rename(secret)
    (tmp_path / layout.step_times(3)).symlink_to(secret)
    assert sorted(read_step_times(tmp_path)) == [0, 1]


@pytest.mark.parametrize("name", ["rank.jsonl", "rank-1.jsonl", "rankx.jsonl", "rank1.jsonl.tmp"])
def test_stray_files_are_ignored(tmp_path: Path, name: str) -> None:
    _write(tmp_path, 0, _steps(1, 10, 1.0))
    (tmp_path / layout.STEP_TIMES_DIR / name).write_text(json.dumps({"step": 1, "step_s": 1.0}) + "\n")
    assert sorted(read_step_times(tmp_path)) == [0]


def _finished_run(tmp_path: Path) -> Path:
    """A finished local run of 2 nodes x 2 ranks whose rank 3 was slow, no training needed."""
    run_dir = tmp_path / "runs" / "x" / "41"
    run_dir.mkdir(parents=True)
    record = {
        "job_id": "41", "name": "x", "scheduler": "local", "run_dir": str(run_dir), "recipe": "r.yaml",
        "submitted_at": 1.0, "nodes": 2, "ranks_per_node": 2, "launcher": "torchrun",
    }  # fmt: skip
    (run_dir / layout.RUN_RECORD).write_text(json.dumps(record))
    (run_dir / layout.EXIT_CODE).write_text("0\n")
    (run_dir / layout.HOSTFILE).write_text("node-a slots=2\nnode-b slots=2\n")
    for rank in range(4):
        _write(run_dir, rank, _steps(1, 19, 1.5 if rank == 3 else 1.0))
    return run_dir


def test_status_shows_the_straggler_and_json_carries_its_figures(tmp_path: Path) -> None:
    from conftest import run_cli

    run_dir = _finished_run(tmp_path)
    line = "rank 3 on node1 (node-b) is 50% slower than the median step (1.50 s vs 1.00 s over steps 10-19)"
    done = run_cli("status", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert f"  straggler: {line}" in done.stdout.splitlines()
    shown = json.loads(run_cli("status", "--json", str(run_dir)).stdout)
    assert shown["state"] == "COMPLETED" and shown["straggler"] == {
        "rank": 3, "node": 1, "host": "node-b", "step_s": 1.5, "median_s": 1.0, "first_step": 10, "last_step": 19,
        "slower": 0.5, "summary": line,
    }  # fmt: skip
    _write(run_dir, 3, _steps(1, 19, 1.0))
    assert json.loads(run_cli("status", "--json", str(run_dir)).stdout)["straggler"] is None
    assert "straggler" not in run_cli("status", str(run_dir)).stdout


def test_follow_says_the_straggler_once_when_it_appears(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from clusterkit.runs.follow import follow
    from clusterkit.runs.record import read_record
    from clusterkit.runs.status import COMPLETED, RUNNING, JobStatus

    record = read_record(_finished_run(tmp_path))
    slow = {"rank": 3, "summary": "rank 3 on node1 is 50% slower than the median step"}
    answers = iter([JobStatus(RUNNING), JobStatus(RUNNING, straggler=slow), JobStatus(RUNNING, straggler=slow),
                    JobStatus(COMPLETED, 0, straggler=slow)])  # fmt: skip
    out = io.StringIO()
    follow(record, lambda _: next(answers), tmp_path / "none.jsonl", Console(file=out, width=200), poll_s=0.01)
    assert out.getvalue().count("straggler: rank 3 on node1 is 50% slower than the median step") == 1

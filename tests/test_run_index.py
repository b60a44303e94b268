"""The run index ($XDG_STATE_HOME/clusterkit/runs.jsonl): status, logs, cancel and ls find a run
submitted from another directory; concurrent submits (real processes) each add a whole entry,
compaction included; a damaged index, a deleted run dir and a state dir that cannot be written are
warnings, never a traceback or a failed submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterkit.runs import index
from clusterkit.runs.record import RunRecord, read_record
from conftest import REPO, run_cli


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state dir of this test's own, for this process and the CLI processes it starts."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "clusterkit" / "runs.jsonl"


def _submit(tmp_path: Path, name: str = "indexed", **fields) -> RunRecord:
    """A real local-executor job (a script that exits at once), submitted from ``tmp_path/submit``
    with its runs in ``tmp_path/submit/runs`` (the recipe's default ./runs)."""
    where = tmp_path / "submit"
    where.mkdir(exist_ok=True)
    (where / "done.py").write_text("pass\n")
    recipe = where / f"{name}.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "resources": {"time": "5", "nodes": 1, "gpus_per_node": 1},
                "task": {"script": str(where / "done.py")},
                **fields,
            }
        )
    )
    done = run_cli("submit", str(recipe), "--executor", "local", cwd=where)
    assert done.returncode == 0, done.stderr
    return read_record(Path(done.stdout.split("run dir: ", 1)[1].split()[0]))


def _elsewhere(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"
    path.mkdir(exist_ok=True)
    return path


def _wait_done(job_id: str, cwd: Path) -> None:
    deadline = time.monotonic() + 60
    while "COMPLETED" not in run_cli("status", job_id, cwd=cwd).stdout:
        assert time.monotonic() < deadline, "the job did not complete within 60 s"
        time.sleep(0.3)


def test_a_run_is_found_by_job_id_from_any_directory(tmp_path: Path, state: Path) -> None:
    record = _submit(tmp_path)
    away = _elsewhere(tmp_path)
    _wait_done(record.job_id, away)
    status = run_cli("status", record.job_id, "--json", cwd=away)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "COMPLETED", status.stderr
    logs = run_cli("logs", record.job_id, cwd=away)
    assert logs.returncode == 0, logs.stderr
    cancel = run_cli("cancel", record.job_id, cwd=away)
    assert cancel.returncode == 0 and "already ended (COMPLETED)" in cancel.stdout
    listing = run_cli("ls", cwd=away)  # no ./runs here: the index's runs
    assert listing.returncode == 0 and f"{record.job_id}  indexed" in listing.stdout, listing.stdout
    entry = json.loads(state.read_text().splitlines()[-1])
    assert entry["job_id"] == record.job_id and entry["record_dir"] == record.run_dir


def test_an_array_task_is_found_through_its_array(tmp_path: Path, state: Path) -> None:
    record = _submit(tmp_path, "swept", sweep={"grid": {"env.SEED": ["1", "2"]}})
    assert record.tasks == (0, 1) and len(state.read_text().splitlines()) == 1  # the array's entry only
    away = _elsewhere(tmp_path)
    done = run_cli("status", f"{record.job_id}_1", "--json", cwd=away)
    assert done.returncode == 0, done.stderr
    missing = run_cli("status", f"{record.job_id}_7", cwd=away)
    assert missing.returncode == 2 and f"job {record.job_id} has no task 7" in missing.stderr


def test_a_deleted_run_is_skipped(tmp_path: Path, state: Path) -> None:
    import shutil

    gone, kept = _submit(tmp_path, "gone"), _submit(tmp_path, "kept")
    shutil.rmtree(gone.run_dir)
    away = _elsewhere(tmp_path)
    done = run_cli("status", gone.job_id, cwd=away)
    assert done.returncode == 2 and done.stderr.startswith(f"clusterkit: no run with job id {gone.job_id} under ")
    listing = run_cli("ls", cwd=away)
    assert kept.job_id in listing.stdout and gone.job_id not in listing.stdout and listing.stderr == ""


DAMAGE = [
    b"not json at all\n",
    b'{"job_id": "1", "name": "x"\n',  # cut short
    b"[1, 2, 3]\n",
    b'{"job_id": "7", "name": "x", "scheduler": "local", "record_dir": "relative/dir", "submitted_at": 1}\n',
    b'{"job_id": "../x", "name": "x", "scheduler": "local", "record_dir": "/tmp", "submitted_at": 1}\n',
    b'{"job_id": "8", "name": "x", "scheduler": "local", "record_dir": "/tmp", "submitted_at": "soon"}\n',
    b"\xff\xfe\x00binary\x1b[31m\n",
]


def test_a_damaged_index_is_skipped_line_by_line_with_one_warning(tmp_path: Path, state: Path) -> None:
    first = _submit(tmp_path, "first")
    with state.open("ab") as handle:
        handle.write(b"".join(DAMAGE) + b'{"job_id": "9", "name": "cut')  # the last line cut short, no newline
    second = _submit(tmp_path, "second")  # appended as a line of its own, not glued to the cut one
    assert state.read_bytes().endswith(b"\n") and state.read_text(errors="replace").splitlines()[-1].startswith(
        '{"job_id"'
    )
    away = _elsewhere(tmp_path)
    for job in (first, second):
        done = run_cli("status", job.job_id, cwd=away)
        assert done.returncode == 0, done.stderr
        warning = f"clusterkit: warning: {state}: skipped {len(DAMAGE) + 1} damaged lines of the run index"
        assert done.stderr.splitlines() == [warning]
    listing = run_cli("ls", cwd=away)
    assert first.job_id in listing.stdout and second.job_id in listing.stdout and "Traceback" not in listing.stderr
    state.write_bytes(b"\x00" * 100)  # wholly garbage: still no traceback
    done = run_cli("status", first.job_id, cwd=away)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_a_state_dir_that_cannot_be_written_warns_and_the_submit_succeeds(tmp_path: Path, state: Path) -> None:
    # A file where the state directory should be (root ignores permissions: this works as root too).
    state.parent.parent.mkdir(parents=True)
    state.parent.write_text("")
    record = _submit(tmp_path, "no-state")
    assert (Path(record.run_dir) / "run.json").is_file()
    state.parent.unlink()
    state.parent.mkdir()
    state.symlink_to("/dev/full")  # a full disk: every write fails with ENOSPC
    where = tmp_path / "submit"
    done = run_cli("submit", str(where / "no-state.yaml"), "--executor", "local", cwd=where)
    assert done.returncode == 0 and "submitted job" in done.stdout
    assert f"{state}: cannot add job " in done.stderr and "No space left on device" in done.stderr
    assert "Traceback" not in done.stderr


ADDER = """
import sys, time
from pathlib import Path
from clusterkit.runs import index
from clusterkit.runs.record import RunRecord
index.COMPACT_BYTES = int(sys.argv[3])
base, worker = Path(sys.argv[1]), sys.argv[2]
while time.time() < float(sys.argv[4]):  # start together
    pass
for n in range(int(sys.argv[5])):
    run_dir = base / f"{worker}-{n}"
    run_dir.mkdir()
    record = RunRecord(f"{worker}{n:03d}", "c", "local", str(run_dir), "r.yaml", time.time(), 1, 1, "torchrun")
    record.write()
    index.add_run(record, run_dir)
"""


@pytest.mark.parametrize("compact_bytes", [index.COMPACT_BYTES, 0], ids=["append", "compact-every-time"])
def test_concurrent_submits_each_add_a_whole_entry(tmp_path: Path, state: Path, compact_bytes: int) -> None:
    workers, each = 8, 25
    start = time.time() + 1.0
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", ADDER, str(tmp_path), str(w + 1), str(compact_bytes), str(start), str(each)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    for process in processes:
        assert process.wait(timeout=120) == 0 and process.stderr.read() == ""
    lines = state.read_text().splitlines()
    ids = {json.loads(line)["job_id"] for line in lines}
    assert ids == {f"{w + 1}{n:03d}" for w in range(workers) for n in range(each)}
    assert len(lines) == workers * each  # nothing lost, nothing doubled
    assert [p.name for p in state.parent.iterdir()] == [state.name]  # no compaction leftovers


def test_compaction_keeps_only_runs_still_on_disk(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "COMPACT_BYTES", 0)
    kept = tmp_path / "kept"
    kept.mkdir()
    RunRecord("2", "k", "local", str(kept), "r.yaml", 2.0, 1, 1, "torchrun").write()
    gone = RunRecord("1", "g", "local", str(tmp_path / "gone"), "r.yaml", 1.0, 1, 1, "torchrun")
    index.add_run(gone, tmp_path / "gone")
    index.add_run(read_record(kept), kept)
    assert [json.loads(line)["job_id"] for line in state.read_text().splitlines()] == ["2"]
    assert index.indexed_job_ids() == ["2"] and index.find_indexed("1") is None


def test_a_hung_lock_holder_does_not_hold_the_submit_up(tmp_path: Path, state: Path) -> None:
    _submit(tmp_path, "waits")  # once with the index free: it is written, the recipe is there
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\nf = open(sys.argv[1], 'ab')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)",
            str(state),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    where = tmp_path / "submit"
    try:
        assert holder.stdout.readline() == "held\n"
        start = time.monotonic()
        done = run_cli("submit", str(where / "waits.yaml"), "--executor", "local", cwd=where)
        assert time.monotonic() - start < index.LOCK_WAIT_S + 30
        assert done.returncode == 0 and "submitted job" in done.stdout
        assert "cannot add job" in done.stderr and "locked by another process for 5 s" in done.stderr
    finally:
        holder.kill()
        holder.wait()
    assert state.read_text().count("\n") == 1  # the second was given up on

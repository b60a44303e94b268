"""``clusterkit top`` (issue 28): one squeue per refresh for every SLURM run shown (a fake login
host counts the calls), each row computed from crafted run directories (rate, ETA, last progress,
HUNG from a hang record good, malformed, huge or a FIFO, NaN and strings in metrics, a metrics file
cut short), the plain and --json output, --once, escape sequences shown inert, the keys of the
full-screen view, a login node's run directory read in one command, and on the dev cluster two
real runs listed by ``top --once --json``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterkit.cli.top import Watch, cmd_top, interval_seconds, remote_run_files, selected_runs
from clusterkit.cli.top_screen import CANCEL, LOGS, QUIT, View
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import RUNNING, JobStatus
from clusterkit.runs.top import (
    HANG_LIMIT,
    METRICS_TAIL,
    STRAGGLER,
    UNREADABLE_HANG,
    RunFiles,
    cells,
    hang_summary,
    read_run_files,
    row_json,
    row_of,
)
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.spec.layout import EXIT_CODE, HANG_RECORD, HEARTBEAT, METRICS
from conftest import REPO, interruptible
from test_json_shapes import DOCS, differences

ESC = "\x1b]0;owned\x07\x1b[2J"  # a window title and a screen clear, as a hostile name would carry


class FakeHost:
    """This machine's files, and a squeue that logs each call and answers every job RUNNING."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv, timeout: float = 30.0) -> Completed:
        self.calls.append(list(argv))
        ids = next(a for a in argv if a.startswith("--jobs="))[len("--jobs=") :].split(",")
        return Completed(0, "".join(f"{i}|{i}|N/A|RUNNING|None|0|\n" for i in ids), "")

    def open(self, path: str):
        return open(path, "rb")

    @property
    def squeues(self) -> int:
        return sum("squeue" in call for call in self.calls)


def _record(runs: Path, job_id: str, name: str = "tiny", **fields) -> RunRecord:
    run_dir = runs / "tiny" / job_id
    run_dir.mkdir(parents=True)
    given = dict(scheduler="slurm", recipe="r.yaml", nodes=1, ranks_per_node=1, launcher="python")
    record = RunRecord(
        job_id=job_id, name=name, run_dir=str(run_dir), submitted_at=float(job_id), **{**given, **fields}
    )
    record.write()
    return record


def _log(step: int, when: float, speed=100.0, max_steps=100) -> str:
    return json.dumps({"event": "log", "time": when, "step": step, "max_steps": max_steps, "samples_per_s": speed})


def _args(runs: Path, **given) -> argparse.Namespace:
    values = dict(sweep=None, runs_dir=str(runs), limit=20, all=False, interval=5.0, once=False, json=False)
    return argparse.Namespace(**{**values, **given}, accept_new_host_key=False)


@pytest.fixture(autouse=True)
def _own_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # never the real run index


def _opener(host: FakeHost):
    return lambda record: contextlib.nullcontext(SlurmScheduler(host))


# --- one squeue per refresh -----------------------------------------------------------------------


def test_each_refresh_of_many_runs_is_one_squeue(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    for n in range(6):
        _record(runs, str(700 + n))
    host, naps = FakeHost(), []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt  # Ctrl-C while waiting for the fourth refresh

    with pytest.raises(KeyboardInterrupt):
        cmd_top(_args(runs, interval=2.5), opener=_opener(host), sleep=sleep)
    assert host.squeues == 3 and len(host.calls) == 3  # three refreshes, one squeue each, nothing else
    assert all("--jobs=700,701,702,703,704,705" in " ".join(call) for call in host.calls)
    assert naps == [2.5, 2.5, 2.5]
    assert capsys.readouterr().out.count("JOB  ") == 3  # a table per refresh


def test_once_prints_one_table_and_asks_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    for n in range(3):
        _record(runs, str(800 + n))
    host = FakeHost()
    assert cmd_top(_args(runs, once=True), opener=_opener(host)) == 0
    out = capsys.readouterr().out.splitlines()
    assert host.squeues == 1
    assert out[0].split() == ["JOB", "NAME", "STATE", "STEP", "SAMPLES/S", "ETA", "LAST", "PROGRESS", "FLAGS"]
    assert [line.split()[:3] for line in out[1:4]] == [
        ["802", "tiny", "RUNNING"],
        ["801", "tiny", "RUNNING"],
        ["800", "tiny", "RUNNING"],
    ]


def test_ended_runs_are_left_out_unless_all_and_the_loop_ends_when_all_have(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "runs"
    done = _record(runs, "900")
    (done.path / EXIT_CODE).write_text("0\n")

    class Forgetting(FakeHost):  # SLURM no longer knows the job: its exit code tells
        def run(self, argv, timeout: float = 30.0) -> Completed:
            self.calls.append(list(argv))
            return Completed(0, "", "")

    assert cmd_top(_args(runs), opener=_opener(Forgetting())) == 0
    assert "no runs going" in capsys.readouterr().out
    host = Forgetting()
    assert cmd_top(_args(runs, all=True), opener=_opener(host)) == 0  # every run ended: one table, no sleep
    assert "COMPLETED" in capsys.readouterr().out and host.squeues == 1


# --- rows from run directories --------------------------------------------------------------------


def _row(tmp_path: Path, metrics: str = "", state: str = "RUNNING", hang: bytes | None = None, now: float = 2000.0):
    record = _record(tmp_path / "runs", "42")
    files = RunFiles(metrics.encode(), 1990.0 if metrics else None, None, hang, now)
    return row_of(record, JobStatus(state), files)


def test_rate_eta_and_last_progress_from_the_recent_lines(tmp_path: Path) -> None:
    lines = [_log(step, 1000.0 + step, speed=90.0 + step) for step in range(10, 70, 10)]
    row = _row(tmp_path, "\n".join(lines) + "\n")
    assert row.step == 60 and row.max_steps == 100
    assert row.samples_per_s == pytest.approx(sum(90.0 + s for s in range(20, 70, 10)) / 5)  # the last 5 lines
    assert row.eta_s == pytest.approx(40.0)  # 1 step/s, 40 steps left
    assert row.idle_s == pytest.approx(10.0)
    assert cells(row)[3:7] == ("60/100", "130.0", "40s", "10s ago")


def test_nan_strings_bools_and_a_cut_line_count_as_not_logged(tmp_path: Path) -> None:
    metrics = "\n".join(
        [
            '{"event": "log", "time": 1000, "step": 5, "max_steps": NaN, "samples_per_s": NaN}',
            '{"event": "log", "time": "soon", "step": "six", "samples_per_s": "fast"}',
            '{"event": "log", "time": 1010, "step": true, "samples_per_s": Infinity}',
            '{"event": "log", "time": 1020, "step": 7, "samples_per_s": -1}',
            '{"event": "log", "time": 10',  # cut short when its rank was killed
        ]
    )
    row = _row(tmp_path, metrics)
    assert (row.step, row.max_steps, row.samples_per_s) == (7, None, None)
    assert row.eta_s is None
    assert cells(row)[3:6] == ("7", "–", "–")
    assert json.dumps(row_json(row), allow_nan=False)  # never NaN in the JSON


def test_no_metrics_no_eta_and_an_ended_run_has_none(tmp_path: Path) -> None:
    assert cells(_row(tmp_path))[3:7] == ("–", "–", "–", "–")
    lines = "\n".join(_log(s, 1000.0 + s) for s in (10, 20)) + "\n"
    (tmp_path / "runs").rename(tmp_path / "old")
    assert _row(tmp_path, lines, state="COMPLETED").eta_s is None


def test_the_heartbeat_counts_as_progress(tmp_path: Path) -> None:
    run_dir = _record(tmp_path / "runs", "7").path
    (run_dir / METRICS).write_text(_log(1, 1.0) + "\n")
    os.utime(run_dir / METRICS, (1000, 1000))
    (run_dir / HEARTBEAT).touch()
    os.utime(run_dir / HEARTBEAT, (1900, 1900))
    files = read_run_files(run_dir, now=2000.0)
    assert (files.metrics_mtime, files.heartbeat_mtime) == (1000.0, 1900.0)
    assert row_of(RunRecord(**{**_fields(run_dir)}), JobStatus("RUNNING"), files).idle_s == 100.0


def _fields(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_a_huge_metrics_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    run_dir = _record(tmp_path / "runs", "8").path
    with open(run_dir / METRICS, "w") as out:
        out.write('{"event": "log", "step": 1, "padding": "' + "x" * (4 * METRICS_TAIL) + '"}\n')
        for step in range(2, 400):
            out.write(_log(step, 1000.0 + step, max_steps=1000) + "\n")
    files = read_run_files(run_dir, now=2000.0)
    assert len(files.metrics) <= METRICS_TAIL and files.metrics.startswith(b'{"event"')  # from a whole line
    assert row_of(RunRecord(**_fields(run_dir)), JobStatus("RUNNING"), files).step == 399


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        (
            json.dumps({"line": "no progress for 600 s; rank 3 in all_reduce"}),
            "no progress for 600 s; rank 3 in all_reduce",
        ),
        (json.dumps({"line": f"stuck {ESC}\nhere"}), "stuck \\x1b]0;owned\\x07\\x1b[2J\\nhere"),
        ('{"line": ', UNREADABLE_HANG),
        ("[1, 2]", UNREADABLE_HANG),
        (json.dumps({"line": 5}), UNREADABLE_HANG),
        ("", UNREADABLE_HANG),
        ("\xff\xfe", UNREADABLE_HANG),
    ],
)
def test_a_hang_record_flags_hung_and_says_why_or_that_it_is_unreadable(
    tmp_path: Path, content: str, shown: str
) -> None:
    row = _row(tmp_path, hang=content.encode("latin-1"))
    assert row.flags == ("HUNG",) and cells(row)[7] == f"HUNG ({shown})"
    assert "\x1b" not in "".join(cells(row))


def test_a_hang_record_too_large_or_a_fifo_is_unreadable_and_never_blocks(tmp_path: Path) -> None:
    run_dir = _record(tmp_path / "runs", "9").path
    (run_dir / HANG_RECORD).write_text(json.dumps({"line": "x" * (2 * HANG_LIMIT)}))
    assert hang_summary(read_run_files(run_dir, 0.0).hang) == UNREADABLE_HANG
    (run_dir / HANG_RECORD).unlink()
    os.mkfifo(run_dir / HANG_RECORD)
    os.mkfifo(run_dir / METRICS)  # no writer: a blocking open would wait forever
    files = read_run_files(run_dir, 0.0)
    assert hang_summary(files.hang) == UNREADABLE_HANG and files.metrics == b""
    assert hang_summary(None) is None


def test_a_straggler_the_status_names_is_flagged(tmp_path: Path) -> None:
    record = _record(tmp_path / "runs", "10")
    slow = {"rank": 3, "summary": "rank 3 on node1 is 42% slower than the median step"}
    row = row_of(record, JobStatus(RUNNING, straggler=slow), read_run_files(Path(record.run_dir), 0.0))
    assert row.flags == (STRAGGLER,) and row.straggler == slow["summary"]


# --- output ---------------------------------------------------------------------------------------


def test_escape_sequences_in_names_and_states_reach_no_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    record = _record(runs, "11", name=f"evil{ESC}")
    (record.path / METRICS).write_text(json.dumps({"event": "log", "step": 3, "note": ESC}) + "\n")
    for as_json in (False, True):
        assert cmd_top(_args(runs, once=True, json=as_json), opener=_opener(FakeHost())) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out
        assert ("evil\\u001b]0;owned" if as_json else "evil\\x1b]0;owned") in out


def test_json_is_one_object_per_run_per_refresh_as_documented(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    for n in range(2):
        record = _record(runs, str(500 + n))
        (record.path / METRICS).write_text("\n".join(_log(s, 1000.0 + s) for s in (10, 20)) + "\n")
    (record.path / HANG_RECORD).write_text('{"line": "no progress for 60 s"}')
    naps = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cmd_top(_args(runs, json=True), opener=_opener(FakeHost()), sleep=sleep)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 4 and [line["job_id"] for line in lines] == ["501", "500"] * 2
    doc = DOCS["clusterkit top --json"][0]
    assert all(differences(line, doc) == [] for line in lines)
    assert lines[0]["flags"] == ["HUNG"] and lines[0]["hang"] == "no progress for 60 s"
    assert (lines[1]["step"], lines[1]["max_steps"], lines[1]["eta_s"]) == (20, 100, 80.0)


def test_a_sweep_by_job_id_or_name_shows_its_tasks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    array = _record(runs, "600", tasks=(0, 1))
    for index in array.tasks:
        (array.path / str(index)).mkdir()
    _record(runs, "601")
    for reference in ("600", str(array.path), "tiny"):
        records, names = selected_runs(reference, str(runs), 20)
        assert [r.job_id for r in records] == ["600_0", "600_1"]
    with pytest.raises(Exception, match="no sweep or run 'nope'"):
        selected_runs("nope", str(runs), 20)


def test_the_interval_must_be_a_positive_number_of_seconds() -> None:
    assert interval_seconds("0.5") == 0.5
    for bad in ("0", "-1", "nan", "inf", "soon", "3601"):
        with pytest.raises(argparse.ArgumentTypeError):
            interval_seconds(bad)


# --- the full-screen view's keys ------------------------------------------------------------------


def test_keys_move_the_selection_and_cancel_only_after_yes() -> None:
    view = View()
    assert view.on_key(b"\x1b[B", 3) is None and view.selected == 1
    assert view.on_key(b"j", 3) is None and view.on_key(b"j", 3) is None and view.selected == 2
    assert view.on_key(b"\x1b[A", 3) is None and view.selected == 1
    assert view.on_key(b"c", 3) is None and view.confirming
    assert view.on_key(b"\r", 3) is None and not view.confirming and view.message == "not cancelled"
    assert view.on_key(b"c", 3) is None and view.on_key(b"y", 3) == CANCEL
    assert view.on_key(b"l", 3) == LOGS and view.on_key(b"q", 3) == QUIT
    assert View().on_key(b"c", 0) is None  # nothing to cancel


def test_cancel_asks_the_open_adapter_and_leaves_an_ended_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    running, ended = _record(runs, "12"), _record(runs, "13")
    (ended.path / EXIT_CODE).write_text("1\n")
    host = FakeHost()
    cancelled = []

    class Cancelling(SlurmScheduler):
        def statuses(self, records):
            return [JobStatus("FAILED" if r.job_id == "13" else "RUNNING") for r in records]

        def cancel(self, record):
            cancelled.append(record.job_id)

    with Watch([running, ended], [None, None], lambda r: contextlib.nullcontext(Cancelling(host))) as watch:
        assert watch.cancel(0) == "cancelled job 12"
        assert watch.cancel(1) == "job 13 already ended (FAILED): nothing cancelled"
    assert cancelled == ["12"]


# --- a login node's run directory -----------------------------------------------------------------


class ShellHost:
    """A login node stand-in: the argv run here, as the SSH host runs it there."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv, timeout: float = 30.0) -> Completed:
        self.calls += 1
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
        return Completed(done.returncode, done.stdout, done.stderr)


def test_a_login_nodes_run_dir_is_read_in_one_command(tmp_path: Path) -> None:
    run_dir = _record(tmp_path / "runs", "14").path
    (run_dir / METRICS).write_text('{"step": 1, "pad": "' + "y" * METRICS_TAIL + '"}\n' + _log(9, 1.0) + "\n")
    (run_dir / HEARTBEAT).touch()
    (run_dir / HANG_RECORD).write_text('{"line": "stuck"}')
    host = ShellHost()
    files = remote_run_files(host, str(run_dir))
    assert host.calls == 1
    assert files.metrics == (_log(9, 1.0) + "\n").encode() and files.hang == b'{"line": "stuck"}'
    assert files.heartbeat_mtime is not None and abs(files.now - time.time()) < 5
    os.unlink(run_dir / HANG_RECORD)
    os.mkfifo(run_dir / HANG_RECORD)  # never read (it would block): unreadable
    assert remote_run_files(host, str(run_dir)).hang == b""
    missing = remote_run_files(host, str(tmp_path / "gone"))
    assert (missing.metrics, missing.hang, missing.metrics_mtime) == (b"", None, None)


# --- the command line -----------------------------------------------------------------------------


def test_once_through_the_cli_exits_0_and_prints_no_escape(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    record = _record(runs, "15", name=f"x{ESC}", scheduler="local")
    (record.path / EXIT_CODE).write_text("0\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit", "top", "--all", "--once", "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "COMPLETED" in done.stdout and "\x1b" not in done.stdout


# --- the dev cluster --------------------------------------------------------------------------------


@pytest.mark.slurm
def test_top_once_json_lists_two_real_runs_with_their_states(dev_cluster: str, tmp_path: Path) -> None:
    from slurm_jobs import start

    started = [start(tmp_path) for _ in range(2)]  # two tiny trainings, runs_dir tmp_path/runs
    job_ids = [job_id for job_id, _ in started]
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit", "top", "--all", "--once", "--json", "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    shown = {line["job_id"]: line["state"] for line in map(json.loads, done.stdout.splitlines())}
    assert set(shown) == set(job_ids)
    assert all(state in ("PENDING", "RUNNING", "COMPLETED") for state in shown.values()), shown
    subprocess.run(["scancel", *job_ids], capture_output=True)


# --- the full-screen view on a real terminal --------------------------------------------------------


def _own_terminal() -> None:
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    interruptible()


def _on_a_terminal(tmp_path: Path, keys: list[bytes]) -> tuple[int, bytes, list]:
    """``clusterkit top`` on a pseudo-terminal, a stand-in squeue answering RUNNING: the keys sent
    once it drew, its exit code, what it wrote, and the terminal's modes after it ended."""
    import pty
    import select
    import termios

    runs = tmp_path / "runs"
    _record(runs, "16", name=f"p{ESC}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho '16|16|N/A|RUNNING|None|0|'\n")
    (bin_dir / "squeue").chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "TERM": "xterm",
    }
    primary, secondary = pty.openpty()
    before = termios.tcgetattr(secondary)
    process = subprocess.Popen(
        [sys.executable, "-m", "clusterkit", "top", "--runs-dir", str(runs), "--interval", "0.2"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        preexec_fn=_own_terminal,  # the pseudo-terminal controls it: Ctrl-C there is its SIGINT
    )
    written = b""

    def read(until: float) -> None:
        nonlocal written
        while time.monotonic() < until and select.select([primary], [], [], 0.1)[0]:
            try:
                written += os.read(primary, 65536)
            except OSError:
                return

    deadline = time.monotonic() + 30
    while b"RUNNING" not in written and time.monotonic() < deadline:
        read(time.monotonic() + 0.2)
    for key in keys:
        os.write(primary, key)
        read(time.monotonic() + 0.5)
    # Read on while it ends: a terminal whose buffer fills blocks the writer (the last redraws, the
    # screen's restore), so a test that stopped reading would hang the view it is waiting for.
    deadline = time.monotonic() + 30
    try:
        while process.poll() is None and time.monotonic() < deadline:
            read(time.monotonic() + 0.2)
        code = process.wait(timeout=1)
    finally:
        process.kill()  # one that did not end is no test's leftover
    read(time.monotonic() + 0.5)
    after = termios.tcgetattr(secondary)
    os.close(primary)
    os.close(secondary)
    return code, written, [before, after]


def test_the_full_screen_view_quits_on_q_and_restores_the_terminal(tmp_path: Path) -> None:
    code, written, (before, after) = _on_a_terminal(tmp_path, [b"\x1b[B", b"q"])
    assert code == 0 and b"RUNNING" in written and b"p\\x1b]0;owned" in written
    assert b"\x1b]0;owned" not in written  # the name's escape sequence never reaches the terminal raw
    assert before[3] == after[3]  # echo and line mode back as they were


def test_ctrl_c_ends_the_view_with_130_and_restores_the_terminal(tmp_path: Path) -> None:
    code, _, (before, after) = _on_a_terminal(tmp_path, [b"\x03"])
    assert code == 130 and before[3] == after[3]


def test_l_leaves_the_view_and_says_how_to_read_the_logs(tmp_path: Path) -> None:
    code, written, _ = _on_a_terminal(tmp_path, [b"l"])
    assert code == 0 and b"clusterkit logs 16 -f" in written


def test_a_scheduler_that_fails_shows_its_runs_unknown_and_the_view_goes_on(tmp_path: Path) -> None:
    from clusterkit.errors import SchedulerError

    runs = tmp_path / "runs"
    record = _record(runs, "17")

    class Hanging(FakeHost):
        def run(self, argv, timeout: float = 30.0) -> Completed:
            raise SchedulerError("squeue: no answer within 30 s")

    with Watch([record], [None], _opener(Hanging())) as watch:
        (row,) = watch.refresh()
    assert row.state == "UNKNOWN" and row.step is None

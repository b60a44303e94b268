"""Every rank's stacks and the watchdog, in one process against a fake job environment: the dump
files real Python processes write when the supervisor's sitecustomize registered them, their
parsing and summary, the watchdog's decisions (stacks, fail, retry without the odd ranks' nodes),
and what `status` and `clusterkit stacks` make of the records. The whole path on real jobs:
test_hang_local.py (local executor) and test_while_running_slurm.py (the dev cluster)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterkit.errors import SchedulerError, UsageError
from clusterkit.runs.record import RunRecord
from clusterkit.runs.stacks import narrowed, text_lines
from clusterkit.runs.status import FAILED, RUNNING, JobStatus, explained
from clusterkit.schedulers.host import Completed, LocalHost
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.spec.watchdog import seconds
from clusterkit.supervisor import stacks
from clusterkit.supervisor.plan import Recovery, Watchdog
from clusterkit.supervisor.watchdog import EXIT_HUNG, Progress
from test_supervisor import FakeJob, _plan, _supervise

SITE = Path(stacks.__file__).parent / "site"

DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/opt/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/u/train.py", line 88 in step
  File "/home/u/train.py", line 120 in <module>
"""


def _dump(func: str, file: str = "/home/u/data.py", line: int = 40) -> str:
    return f'Current thread 0x00007f0000000001 (most recent call first):\n  File "{file}", line {line} in {func}\n'


def test_a_dump_is_parsed_innermost_first_and_the_newest_of_several_wins() -> None:
    threads = stacks.parse(DUMP)
    assert [current for current, _ in threads] == [False, True]
    assert threads[1][1][0] == ("/opt/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce")
    newer = stacks.parse(DUMP + _dump("next_batch"))
    assert newer == [(True, [("/home/u/data.py", 40, "next_batch")])]
    sample = stacks.Sample(0, 0, 1, False, threads)
    assert sample.where == threads[1][1][0]  # the thread that took the signal, not the first listed


def test_the_summary_names_the_odd_ranks_with_their_node_and_the_silent_ones() -> None:
    reduce = stacks.parse(DUMP)
    samples = [
        stacks.Sample(0, 0, 10, False, reduce),
        stacks.Sample(1, 0, 11, False, stacks.parse(_dump("next_batch"))),
        stacks.Sample(2, 1, 12, False, reduce),
        stacks.Sample(3, 1, 13, False, reduce),
        stacks.Sample(1, 0, 14, True, stacks.parse(_dump("worker_loop"))),  # rank 1's data-loader worker
        stacks.Sample(None, 1, 15, False, stacks.parse(_dump("wait", "/x/torchrun.py"))),  # a launcher
    ]
    summary = stacks.summarise(samples, 5, ["node1", "node2"])
    assert summary.line == (
        "3 of 5 ranks are in all_reduce at distributed_c10d.py:3252; "
        "rank 1 on node1 is in next_batch at data.py:40; no stacks from rank 4"
    )
    assert summary.odd == [(1, 0, "next_batch at data.py:40")] and summary.missing == [4]
    assert stacks.summarise([], 2).line == "no stacks from ranks 0, 1"
    stopped = stacks.summarise(samples[:1] + samples[2:4], 4, ["node1", "node2"], ranks_per_node=2)
    assert (
        stopped.line == "3 of 4 ranks are in all_reduce at distributed_c10d.py:3252; no stacks from rank 1 (on node1)"
    )


def _python_with_site(tmp_path: Path, code: str, env: dict[str, str]) -> subprocess.Popen:
    """A Python process started as the job starts one: the supervisor's site folder first on its path."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": os.pathsep.join([str(SITE), str(tmp_path / "later")]),
            "CLUSTERKIT_STACKS_DIR": str(tmp_path / "stacks"),
            **env,
        },
    )


def test_a_rank_that_does_nothing_for_it_dumps_its_stacks_and_its_child_a_file_of_its_own(tmp_path: Path) -> None:
    # The environment's own sitecustomize, later on the path, still runs (it writes a marker).
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "sitecustomize.py").write_text(f"open({str(tmp_path / 'chained')!r}, 'w').close()\n")
    code = (
        "import os, time\n"
        "def deep_in_here():\n"
        "    time.sleep(60)\n"
        "if os.fork() == 0:\n"
        "    def in_the_child():\n"
        "        time.sleep(60)\n"
        "    in_the_child()\n"
        "deep_in_here()\n"
    )
    rank = _python_with_site(tmp_path, code, {"RANK": "3", "SLURM_NODEID": "1"})
    try:
        time.sleep(1.5)  # started, forked and asleep
        folder = tmp_path / "stacks"

        def request() -> None:
            for pid in [rank.pid, *_children(rank.pid)]:
                os.kill(pid, stacks.STACKS_SIGNAL)

        samples = stacks.collect(folder, request, ranks=1)
    finally:
        for pid in [*_children(rank.pid), rank.pid]:
            os.kill(pid, signal.SIGKILL)
        rank.wait()
    assert (tmp_path / "chained").exists()
    mine = [s for s in samples if not s.child]
    children = [s for s in samples if s.child]
    assert [(s.rank, s.node, s.pid) for s in mine] == [(3, 1, rank.pid)]
    assert mine[0].where[2] == "deep_in_here"
    assert len(children) == 1 and children[0].rank == 3 and children[0].where[2] == "in_the_child"


def test_a_process_that_is_no_rank_writes_nothing_and_supervisor_rank_registers_once_its_rank_is_known(
    tmp_path: Path,
) -> None:
    (tmp_path / "sleep.py").write_text("import time\ndef waiting():\n    time.sleep(60)\nwaiting()\n")
    launcher = _python_with_site(tmp_path, "import time; time.sleep(60)", {"SLURM_NODEID": "0"})
    late = _python_with_site(
        tmp_path,
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(Path(stacks.__file__).parent.parent)!r})\n"
        "from supervisor.ranks import run_as_rank\n"
        "os.environ.update(SLURM_PROCID='5', SLURM_LOCALID='1', SLURM_NTASKS='8', SLURM_NODEID='2')\n"
        f"run_as_rank([{str(tmp_path / 'sleep.py')!r}])\n",
        {},
    )
    try:
        time.sleep(1.5)
        samples = stacks.collect(
            tmp_path / "stacks", lambda: [os.kill(p.pid, stacks.STACKS_SIGNAL) for p in (launcher, late)], 1
        )
    finally:
        for process in (launcher, late):
            process.kill()
            process.wait()
    assert [(s.rank, s.node, s.where[2]) for s in samples] == [(5, 2, "waiting")]


def _children(pid: int) -> list[int]:
    from clusterkit.supervisor.processes import descendants

    return descendants(pid)


def test_a_process_without_the_signal_registered_is_untouched(tmp_path: Path) -> None:
    """SIGWINCH's default action is to ignore it: a process that did not register goes on."""
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        os.kill(plain.pid, stacks.STACKS_SIGNAL)
        time.sleep(0.3)
        assert plain.poll() is None
    finally:
        plain.kill()
        plain.wait()


class DumpingJob(FakeJob):
    """Asking for stacks writes the dumps the test gives (rank, node -> innermost function)."""

    def __init__(self, behaviour, dumps: dict[tuple[int, int], str], run_dir: Path) -> None:
        super().__init__(behaviour)
        self.dumps, self.run_dir, self.asked = dumps, run_dir, 0

    def signal_job(self, signum: int) -> None:
        assert signum == stacks.STACKS_SIGNAL
        self.asked += 1
        folder = self.run_dir / "ranks" / "stacks"
        folder.mkdir(parents=True, exist_ok=True)
        for (rank, node), func in self.dumps.items():
            with open(folder / f"rank{rank}-node{node}-pid{100 + rank}.txt", "a") as dump:
                dump.write(_dump(func))


HANGING = {(0, 0): "all_reduce", (1, 0): "all_reduce", (2, 1): "next_batch", (3, 1): "all_reduce"}


@pytest.mark.parametrize("action", ["fail", "retry"])
def test_a_launch_without_progress_is_ended_and_retried_without_the_odd_ranks_node(tmp_path: Path, action) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # An earlier attempt's heartbeat is no progress of this one; node records of the ranks ended
    # by the watchdog say nothing of where the failure began.
    (run_dir / "heartbeat").touch()
    job = DumpingJob({"launch": f"echo '1.0 143' > {run_dir}/ranks/node0.exit; sleep 30"}, HANGING, run_dir)
    (run_dir / "ranks").mkdir()
    plan = _plan(
        watchdog=Watchdog(no_progress_s=60, startup_s=1, action=action),
        recovery=Recovery(signal="USR2", max_requeues=0, max_retries=1),
    )
    started = time.monotonic()
    code, _ = _supervise(tmp_path, plan, job)
    assert code == EXIT_HUNG and time.monotonic() - started < 10
    hang = json.loads((run_dir / "hang.json").read_text())
    assert hang["line"] == "3 of 4 ranks are in all_reduce at data.py:40; rank 2 on n2 is in next_batch at data.py:40"
    assert hang["why"] == "no first step for 1 s (watchdog.startup: 1 s)" and hang["odd_hosts"] == ["n2"]
    assert (run_dir / "exit_code").read_text() == f"{EXIT_HUNG}\n"
    if action == "fail":
        assert job.submitted == []
    else:
        ((argv, _env),) = job.submitted
        assert "--exclude=n2" in argv  # not n1, whose node record came first
    status = explained(_record(run_dir), JobStatus(FAILED, EXIT_HUNG))
    assert status.reason.startswith("HUNG: no first step for 1 s") and "rank 2 on n2" in status.reason


def test_with_action_stacks_the_launch_goes_on_and_the_record_goes_when_progress_returns(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    beat = run_dir / "heartbeat"
    # Steps, then a pause of 2.5 s (a hang for a 1 s watchdog), then steps again until the end.
    launch = f"for i in 1 2 3; do touch {beat}; sleep 0.2; done; sleep 2.5; for i in 1 2 3 4 5; do touch {beat}; sleep 0.3; done"
    job = DumpingJob({"launch": launch}, HANGING, run_dir)
    plan = _plan(watchdog=Watchdog(no_progress_s=1, startup_s=30, action="stacks"))
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 0 and job.asked >= 1
    assert not (run_dir / "hang.json").exists()  # progress came back: the job is not hung any more
    assert json.loads((run_dir / "ranks" / "stacks" / "summary.json").read_text())["reason"].startswith("watchdog:")


def test_progress_counts_a_change_of_either_file_and_the_limits_switch_after_the_first(tmp_path: Path) -> None:
    now = [0.0]
    progress = Progress(tmp_path, Watchdog(no_progress_s=10, startup_s=100, action="fail"), clock=lambda: now[0])
    now[0] = 99
    assert progress.stalled() is None
    (tmp_path / "metrics.jsonl").write_text('{"event": "log", "step": 1}\n')
    now[0] = 105
    assert progress.stalled() is None and progress.started
    now[0] = 116
    assert progress.stalled() == "no progress for 11 s (watchdog.no_progress: 10 s)"
    (tmp_path / "heartbeat").touch()
    assert progress.stalled() is None


def _record(run_dir: Path) -> RunRecord:
    return RunRecord(
        job_id="4242",
        name="t",
        scheduler="local",
        run_dir=str(run_dir),
        recipe="r.yaml",
        submitted_at=0.0,
        nodes=2,
        ranks_per_node=2,
        launcher="python",
    )


def test_status_shows_a_hang_record_on_one_line_whatever_it_holds(tmp_path: Path) -> None:
    (tmp_path / "hang.json").write_text(json.dumps({"why": "no progress\nfor 5 s", "line": "rank 1 \x1b[31mred"}))
    status = explained(_record(tmp_path), JobStatus(RUNNING))
    assert status.reason == "HUNG: no progress for 5 s: rank 1  [31mred"
    (tmp_path / "hang.json").write_text("[1, 2")
    assert explained(_record(tmp_path), JobStatus(RUNNING)).reason is None


def test_the_stacks_shown_are_narrowed_and_safe_for_a_terminal() -> None:
    summary = {
        "serial": 1,
        "time": 0,
        "method": "faulthandler",
        "summary": {"line": "2 of 2 ranks are in f\x1b]0;x\x07"},
        "processes": [
            {"rank": None, "node": 0, "host": "n1", "pid": 9, "child": False, "threads": []},
            {
                "rank": 1,
                "node": 1,
                "host": "n2",
                "pid": 8,
                "child": False,
                "threads": [{"current": True, "frames": [{"file": "a\nb.py", "line": 3, "function": "f"}]}],
            },
            {"rank": 0, "node": 0, "host": "n1", "pid": 7, "child": False, "threads": []},
        ],
    }
    summary["nccl_dumps"] = {"dir": "/r/ranks/nccl-trace", "files": ["rank_0", "rank_1"]}
    lines = list(text_lines("12", summary))
    assert "NCCL flight recorder dumps (a collective timed out): 2 in /r/ranks/nccl-trace" in lines
    assert "\x1b" not in "".join(lines) and "\n" not in "".join(lines)
    assert [line.split(" (")[0] for line in lines if " (pid " in line] == [
        "rank 0 on n1",
        "rank 1 on n2",
        "a launcher or agent on n1",
    ]
    assert [p["pid"] for p in narrowed(summary, rank=1)["processes"]] == [8]
    assert [p["pid"] for p in narrowed(summary, node="n1")["processes"]] == [9, 7]
    with pytest.raises(
        UsageError, match=r"no stacks from rank 5 in this taking \(ranks and nodes shown: ranks 0, 1; nodes n1, n2\)"
    ):
        narrowed(summary, rank=5)


@pytest.mark.parametrize("text, value", [("90", 90), ("30s", 30), ("15m", 900), ("2h", 7200)])
def test_durations(text: str, value: int) -> None:
    assert seconds(text) == value


class RecordingHost(LocalHost):
    def __init__(self, code: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.code = code

    def run(self, argv, timeout: float = 30.0) -> Completed:
        self.calls.append(list(argv))
        return Completed(self.code, "", "Invalid job id specified" if self.code else "")


def test_slurm_asks_the_batch_step_by_signal_number_and_follows_a_retry(tmp_path: Path) -> None:
    """scancel has no name for SIGWINCH ("Unknown job signal: WINCH", found on the dev cluster)."""
    host = RecordingHost()
    SlurmScheduler(host).ask_stacks(_record(tmp_path))
    assert host.calls == [["scancel", "--batch", f"--signal={int(signal.SIGWINCH)}", "4242"]]
    (tmp_path / "retries.jsonl").write_text(json.dumps({"retry": 1, "job_id": "4300"}) + "\n")
    host.calls.clear()
    SlurmScheduler(host).ask_stacks(_record(tmp_path))
    assert host.calls[0][-1] == "4300"
    with pytest.raises(SchedulerError, match="cannot ask job 4242 for its stacks"):
        SlurmScheduler(RecordingHost(code=1)).ask_stacks(_record(tmp_path))


def test_the_ranks_get_the_site_folder_first_on_their_path_unless_the_run_dir_cannot_be_named(tmp_path: Path) -> None:
    job = FakeJob({}, {"PYTHONPATH": "/mine"})
    _supervise(tmp_path, _plan(), job)
    launch_env = job.started[-1][2]
    assert launch_env["PYTHONPATH"] == f"{tmp_path}/run/supervisor/site:/mine"
    assert launch_env["CLUSTERKIT_HEARTBEAT"] == f"{tmp_path}/run/heartbeat"
    colon = tmp_path / "a:b"
    colon.mkdir()
    job = FakeJob({}, {"PYTHONPATH": "/mine"})
    _supervise(colon, _plan(), job)
    assert job.started[-1][2]["PYTHONPATH"] == "/mine"  # a path PYTHONPATH would split: left out


PYSPY_DUMP = """Process 4242: python3 -I train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    stuck_waiting_for_data (hang_rank.py:17)
    main (hang_rank.py:35)
    <module> (hang_rank.py:48)
Thread 4250 (idle): "pt_autograd_0"
    wait (threading.py:320)
"""


def test_a_py_spy_dump_is_parsed_innermost_first_with_the_main_thread_current() -> None:
    threads = stacks.parse_pyspy(PYSPY_DUMP + PYSPY_DUMP.replace("stuck_waiting_for_data", "next_batch"))
    assert [(current, frames[0]) for current, frames in threads] == [
        (True, ("hang_rank.py", 17, "next_batch")),
        (False, ("threading.py", 320, "wait")),
    ]
    sample = stacks.Sample(1, 0, 4242, False, threads, "py-spy")
    assert stacks.method([sample]).endswith("; py-spy for rank 1, which did not answer it")
    assert stacks.method([stacks.Sample(0, 0, 1, False, [])]) == stacks.METHOD

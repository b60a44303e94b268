"""Following many jobs asks SLURM once per poll for all of them (issue 16): the backoff schedule
(an injected clock, no sleeps), one squeue for every kind of run (plain, array, chain, retried,
forgotten) through stand-in squeue/scontrol programs that log their calls, and on the dev cluster a
real array followed and listed through wrappers that count the real commands' calls."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterkit.runs.poll import FIRST_S, MAX_S, Backoff, poll
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.schedulers.slurm_queue import MAX_JOB_IDS
from clusterkit.spec.layout import EXIT_CODE, RETRIES
from conftest import REPO, run_cli

sys.path.insert(0, str(REPO / "bench"))
from polling import counting_shims, status_calls  # noqa: E402  (the benchmark's own wrappers)

# --- the backoff ------------------------------------------------------------------------------------


def test_the_interval_doubles_while_nothing_changes_and_is_back_to_one_second_after_a_change() -> None:
    answers = iter(["PENDING"] * 6 + ["RUNNING"] * 3 + ["COMPLETED"])
    slept: list[float] = []
    seen = list(poll(lambda: next(answers), lambda state: state == "COMPLETED", sleep=slept.append))
    assert seen == ["PENDING"] * 6 + ["RUNNING"] * 3 + ["COMPLETED"]
    assert slept == [1, 2, 4, 8, 10, 10, 1, 2, 4]  # no wait after the answer that ends it


def test_a_job_that_waits_an_hour_costs_a_poll_every_ten_seconds_and_its_end_is_seen_within_ten() -> None:
    now = [0.0]
    asked: list[float] = []

    def state() -> str:
        asked.append(now[0])
        return "PENDING" if now[0] < 3600 else "RUNNING" if now[0] < 3630 else "COMPLETED"

    def sleep(seconds: float) -> None:
        now[0] += seconds

    list(poll(state, lambda s: s == "COMPLETED", sleep=sleep))
    gaps = [later - earlier for earlier, later in zip(asked, asked[1:])]
    assert max(gaps) == MAX_S and min(gaps) == FIRST_S
    assert len(asked) < 3630 / MAX_S + 10  # one poll a second would be 3630
    assert asked[-1] - 3630 <= MAX_S


def test_a_backoff_can_be_tuned_and_never_waits_longer_than_its_cap() -> None:
    backoff = Backoff(first_s=0.5, max_s=3, factor=3)
    assert [backoff.after(False) for _ in range(4)] == [0.5, 1.5, 3, 3]
    assert backoff.after(True) == 0.5


# --- one squeue for every kind of run ----------------------------------------------------------------


def _stand_ins(
    monkeypatch: pytest.MonkeyPatch,
    bin_dir: Path,
    log: Path,
    squeue_out: str,
    squeue_rc: int = 0,
    scontrol_out: str = "",
) -> None:
    """squeue, scontrol and sacct first on PATH that log their argv (one line per call) and print what a
    cluster would (one without accounting: never the real sacct of a dev cluster that may be up)."""
    bin_dir.mkdir()
    no_accounting = "Slurm accounting storage is disabled\n"
    for name, out, rc in (
        ("squeue", squeue_out, squeue_rc),
        ("scontrol", scontrol_out, 0),
        ("sacct", no_accounting, 1),
    ):
        (bin_dir / f"{name}.out").write_text(out)
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\ncat "{bin_dir}/{name}.out"\nexit {rc}\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _record(tmp_path: Path, job_id: str, **fields) -> RunRecord:
    run_dir = tmp_path / "runs" / job_id
    run_dir.mkdir(parents=True)
    return RunRecord(
        job_id=job_id,
        name="poll",
        scheduler="slurm",
        run_dir=str(run_dir),
        recipe="r.yaml",
        submitted_at=0.0,
        nodes=1,
        ranks_per_node=1,
        launcher="python",
        **fields,
    )


def _runs(tmp_path: Path) -> list[RunRecord]:
    plain = _record(tmp_path, "100")
    array = _record(tmp_path, "101", tasks=(0, 1))
    for index in (0, 1):
        (Path(array.run_dir) / str(index)).mkdir()
    retried = _record(tmp_path, "102")
    (Path(retried.run_dir) / RETRIES).write_text(json.dumps({"retry": 1, "job_id": "105"}) + "\n")
    chain = _record(tmp_path, "103", links=2)
    forgotten_ok = _record(tmp_path, "104")
    (Path(forgotten_ok.run_dir) / EXIT_CODE).write_text("0\n")
    forgotten = _record(tmp_path, "106")
    return [plain, array, retried, chain, forgotten_ok, forgotten]


SQUEUE = """\
100|100|N/A|RUNNING|None|0|
110|101|0|COMPLETED|None|0|
101|101|1|FAILED|NonZeroExitCode|768|
111|103|0|COMPLETED|None|0|
103|103|1|RUNNING|None|0|
105|105|N/A|PENDING|BeginTime|0|
squeue: warning: a line that is not a job
"""


def test_many_runs_of_every_kind_are_one_squeue_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    _stand_ins(monkeypatch, tmp_path / "bin", log, SQUEUE)
    found = SlurmScheduler().statuses(_runs(tmp_path))
    assert [(s.state, s.exit_code) for s in found] == [
        ("RUNNING", None),
        ("FAILED", None),
        ("PENDING", None),
        ("RUNNING", None),
        ("COMPLETED", 0),
        ("UNKNOWN", None),
    ]
    assert found[1].reason == "1 COMPLETED, 1 FAILED" and found[3].reason == "link 2 of 2"
    assert found[2].reason == "retry 1 as job 105; BeginTime"
    assert found[4].accounting == found[5].accounting and "accounting storage is disabled" in found[5].accounting
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("squeue ")  # the forgotten jobs: squeue answered, no scontrol
    assert "--jobs=100,101,103,104,105,106 " in calls[0] and "--array --states=all" in calls[0]
    # One sacct for the jobs squeue no longer lists; while others run, none for the ended ones' times.
    assert calls[1].startswith("sacct ") and "--jobs=104,106 " in calls[1]


def test_an_array_task_gets_its_exit_code_from_squeue_when_its_run_dir_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_ins(monkeypatch, tmp_path / "bin", tmp_path / "calls.log", SQUEUE)
    task = _record(tmp_path, "101_1")
    assert SlurmScheduler().status(task).exit_code == 3  # 768 = exit code 3 << 8


def test_more_runs_than_one_argument_holds_list_every_job_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    ids = [str(5000 + n) for n in range(MAX_JOB_IDS + 1)]
    _stand_ins(monkeypatch, tmp_path / "bin", log, "".join(f"{i}|{i}|N/A|RUNNING|None|0|\n" for i in ids))
    records = [
        RunRecord(
            job_id=i,
            name="poll",
            scheduler="slurm",
            run_dir=str(tmp_path / "none" / i),
            recipe="r.yaml",
            submitted_at=0.0,
            nodes=1,
            ranks_per_node=1,
            launcher="python",
        )
        for i in ids
    ]
    assert {status.state for status in SlurmScheduler().statuses(records)} == {"RUNNING"}
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and " --all " in calls[0] and "--jobs" not in calls[0]


SCONTROL = """\
JobId=100 JobName=poll JobState=RUNNING Reason=None ExitCode=0:0 WorkDir=/runs/a JobState=COMPLETED
JobId=110 ArrayJobId=101 ArrayTaskId=0 JobName=poll JobState=COMPLETED Reason=None ExitCode=0:0
JobId=101 ArrayJobId=101 ArrayTaskId=1 JobName=poll JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0
"""


def test_when_squeue_fails_one_scontrol_listing_answers_for_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    _stand_ins(
        monkeypatch,
        tmp_path / "bin",
        log,
        "slurm_load_jobs error: Invalid job id\n",
        squeue_rc=1,
        scontrol_out=SCONTROL,
    )
    plain, array, *_ = _runs(tmp_path)
    found = SlurmScheduler().statuses([plain, array])
    # SLURM's own JobState counts, not one in a path with a space further along the line.
    assert [s.state for s in found] == ["RUNNING", "FAILED"]
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["squeue", "scontrol"]


def test_no_call_at_all_when_squeue_fails_and_every_run_left_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    _stand_ins(monkeypatch, tmp_path / "bin", log, "", squeue_rc=1)
    run = _record(tmp_path, "104")
    (Path(run.run_dir) / EXIT_CODE).write_text("2\n")
    assert SlurmScheduler().status(run).state == "FAILED"
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["squeue"]


# --- on the dev cluster ------------------------------------------------------------------------------

TASK = """\
import os, sys, time
index = int(os.environ["SLURM_ARRAY_TASK_ID"])
time.sleep(1 + index % 4)
sys.exit(3 if index == 4 else 0)
"""


@pytest.mark.slurm
def test_following_an_array_asks_squeue_once_per_poll_and_ls_once(dev_cluster: str, tmp_path: Path) -> None:
    """Six one-CPU tasks (the two nodes run four at once), task 4 exits 3: the follow polls one squeue
    for all of them at most once a second, never scontrol (the controller still holds every task), and
    the states are right, whatever squeue settings the user's environment holds; ``ls`` and ``status``
    of the runs then ask once each."""
    script = tmp_path / "task.py"
    script.write_text(TASK)
    recipe = tmp_path / "poll.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "poll",
                "cluster": "dev",
                "runs_dir": str(tmp_path / "runs"),
                "launcher": "python",
                "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5", "array": "0-5"},
                "task": {"script": str(script)},
            }
        )
    )
    log = tmp_path / "calls.log"
    counting_shims(tmp_path / "shims", log)
    # A user's squeue settings that would hide the jobs or change squeue's lines, were they not set aside.
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'shims'}{os.pathsep}{os.environ['PATH']}",
        "SQUEUE_PARTITION": "nosuch",
        "SQUEUE_USERS": "nobody",
        "SQUEUE_FORMAT": "%i %j",
        "SQUEUE_FORMAT2": "JobID",
        "SQUEUE_STATES": "PENDING",
    }
    started = time.time()
    done = run_cli("submit", str(recipe), "--follow", cwd=tmp_path, env=env, timeout=300)
    ended = time.time()
    assert done.returncode == 1, done.stdout + done.stderr
    array_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    rows = {line.split()[0]: line.split()[2] for line in done.stdout.splitlines() if line.startswith(f"{array_id}_")}
    assert rows == {f"{array_id}_{i}": "COMPLETED" if i != 4 else "FAILED" for i in range(6)}, done.stdout
    assert re.search(rf"^{array_id}_4 .*FAILED \(exit 3\)", done.stdout, re.M), done.stdout
    assert f"job {array_id}: 5 COMPLETED, 1 FAILED" in done.stdout
    # SLURM told every state on the way: a task it hid would be UNKNOWN until its exit code appeared.
    assert "UNKNOWN" not in done.stdout, done.stdout

    calls = status_calls(log)
    assert calls and all(f"--jobs={array_id} " in argv for _, argv in calls), calls
    # One squeue a poll, polls at least FIRST_S apart; then one more for the results table. sacct only
    # once every task has ended (for their times): after the last poll's squeue and the table's.
    squeues = [when for when, argv in calls if argv.startswith("squeue ")]
    assert [argv.split()[0] for _, argv in calls][-4:] == ["squeue", "sacct", "squeue", "sacct"], calls
    assert len(squeues) == len(calls) - 2, calls
    polls = squeues[:-1]
    assert all(later - earlier >= FIRST_S * 0.9 for earlier, later in zip(polls, polls[1:])), polls
    assert len(polls) <= (ended - started) / FIRST_S + 1  # the results table's call is not a poll

    log.unlink()
    listed = run_cli("ls", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=env)
    assert re.search(rf"^{array_id}\s+poll\s+FAILED", listed.stdout, re.M), listed.stdout
    shown = json.loads(
        run_cli("status", array_id, "--json", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=env).stdout
    )
    assert [t["state"] for t in shown["tasks"]] == ["COMPLETED"] * 4 + ["FAILED", "COMPLETED"]
    assert shown["tasks"][4]["exit_code"] == 3
    assert [argv.split()[0] for _, argv in status_calls(log)] == ["squeue", "sacct", "squeue", "sacct"]


@pytest.mark.slurm
def test_the_benchmark_counts_real_calls(dev_cluster: str, tmp_path: Path) -> None:
    """bench/polling.py end to end, small: its numbers come from the real commands' wrappers."""
    out = tmp_path / "polling.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "polling.py"), "--jobs", "4", "--sleep", "2", "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["states"] == {"COMPLETED": 4} and result["jobs"] == 4
    squeues, saccts = result["by_command"]["squeue"], result["by_command"].get("sacct", 0)
    # No scontrol; sacct only once every task has ended (the last look of the follow, the results table).
    assert 0 < squeues <= result["follow_s"] / FIRST_S + 1 and saccts <= 2 and result["calls"] == squeues + saccts

"""``clusterkit status`` reads SLURM's accounting (sacct) for jobs that have ended: their times (once
every job asked has ended), and for a job the controller has forgotten (MinJobAge) its final state
and exit code; pending and running jobs never ask it; a cluster without accounting (or a sacct that fails or hangs) keeps the
run directory's answer and says why in one line. squeue and sacct answer through a fake Host, with
output captured on the dev cluster; on the dev cluster itself, a real job's sacct row and status
agree, also once squeue is made to forget it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from clusterkit.cli.main import main
from clusterkit.errors import SchedulerError
from clusterkit.runs.record import RunRecord, read_record
from clusterkit.runs.status import JobStatus, slurm_status
from clusterkit.schedulers import slurm
from clusterkit.schedulers.host import Completed, LocalHost
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.schedulers.slurm_queue import with_accounting
from clusterkit.spec.layout import EXIT_CODE
from conftest import run_cli
from slurm_jobs import TINY
from test_slurm_accounting import DEV_CLUSTER

# Captured together on the dev cluster: squeue still lists job 3 (exit 3) and the array 5's tasks,
# jobs 4 and 6 wait; sacct has them all.
SQUEUE = """\
7|5|0|COMPLETED|None|0|
3|3|N/A|FAILED|NonZeroExitCode|768|
5|5|1|FAILED|NonZeroExitCode|256|
4|4|N/A|PENDING|Resources|0|
6|6|N/A|PENDING|Priority|0|
"""
SACCT = """\
3|3|FAILED|3:0|2026-11-27T04:17:47|2026-11-27T04:17:47|2026-11-27T04:17:47|0|node3|billing=1,cpu=1,node=1|debug
4|4|PENDING|0:0|2026-11-27T04:17:47|Unknown|Unknown|0|None assigned||debug
6|6|PENDING|0:0|2026-11-27T04:17:47|Unknown|Unknown|0|None assigned||debug
7|5_0|COMPLETED|0:0|2026-11-27T04:17:47|2026-11-27T04:18:14|2026-11-27T04:18:14|0|node3|billing=1,cpu=1,node=1|debug
5|5_1|FAILED|1:0|2026-11-27T04:17:47|2026-11-27T04:18:14|2026-11-27T04:18:14|0|node3|billing=1,cpu=1,node=1|debug
"""
ANSWERED = Completed(0, SACCT, "")
# sacct on the dev cluster started with CLUSTERKIT_DEV_CLUSTER_ACCOUNTING=0, and with slurmdbd down.
DISABLED = Completed(1, "", "Slurm accounting storage is disabled\n")
DBD_DOWN = Completed(
    1,
    "",
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
    "host:127.0.0.1:16899: Connection refused\nsacct: error: Sending PersistInit msg: Connection refused\n"
    "sacct: error: Problem talking to the database: Connection refused\n",
)


class Slurm:
    """squeue and sacct as the dev cluster answered them; every call logged."""

    name = "fake"

    def __init__(self, squeue: str = SQUEUE, sacct: Completed | Exception = ANSWERED):
        self.squeue, self.sacct, self.calls = squeue, sacct, []

    def run(self, argv, timeout: float = 30.0) -> Completed:
        self.calls.append(list(argv))
        if "sacct" in argv:
            if isinstance(self.sacct, Exception):
                raise self.sacct
            return self.sacct
        return Completed(0, self.squeue, "")

    def open(self, path: str):
        return open(path, "rb")

    def asked(self, program: str) -> list[list[str]]:
        return [call for call in self.calls if program in call]


def _record(runs: Path, job_id: str, exit_code: int | None = None) -> RunRecord:
    run_dir = runs / "tiny" / job_id
    run_dir.mkdir(parents=True)
    record = RunRecord(
        job_id=job_id,
        name="tiny",
        run_dir=str(run_dir),
        submitted_at=1.0,
        scheduler="slurm",
        recipe="r.yaml",
        nodes=1,
        ranks_per_node=1,
        launcher="python",
    )
    record.write()
    if exit_code is not None:
        (run_dir / EXIT_CODE).write_text(f"{exit_code}\n")
    return record


@pytest.fixture(autouse=True)
def _own_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # never the real run index


def _status(host: Slurm, *records: RunRecord) -> list[JobStatus]:
    return SlurmScheduler(host).statuses(list(records))


def test_a_forgotten_job_gets_state_exit_code_and_times_from_sacct(tmp_path: Path) -> None:
    # Before: the controller forgot job 1 and it wrote no exit code, so its state was UNKNOWN.
    host = Slurm(squeue="", sacct=Completed(0, DEV_CLUSTER, ""))
    (status,) = _status(host, _record(tmp_path, "1"))
    assert (status.state, status.exit_code, status.reason, status.accounting) == ("FAILED", 3, None, None)
    assert (status.submitted, status.started, status.ended) == (
        "2026-11-27T04:14:27",
        "2026-11-27T04:14:29",
        "2026-11-27T04:14:29",
    )
    assert status.elapsed_s == 0
    assert len(host.asked("squeue")) == 1 and len(host.asked("sacct")) == 1


def test_the_run_directorys_exit_code_still_wins_and_a_signal_is_no_exit_code(tmp_path: Path) -> None:
    host = Slurm(squeue="", sacct=Completed(0, DEV_CLUSTER, ""))
    told, killed = _status(host, _record(tmp_path, "2", exit_code=0), _record(tmp_path, "4"))
    assert (told.state, told.exit_code, told.elapsed_s) == ("COMPLETED", 0, 1)
    assert (killed.state, killed.exit_code) == ("FAILED", None)  # sacct: 0:9, killed by SIGKILL
    assert len(host.asked("sacct")) == 1 and "--jobs=2,4" in host.asked("sacct")[0]


def test_an_ended_job_the_controller_holds_keeps_its_answer_and_gets_times(tmp_path: Path) -> None:
    host = Slurm()
    (status,) = _status(host, _record(tmp_path, "3"))
    assert (status.state, status.exit_code, status.reason) == ("FAILED", 3, "NonZeroExitCode")
    assert status.started == "2026-11-27T04:17:47" and status.elapsed_s == 0


def test_pending_and_running_jobs_never_ask_sacct(tmp_path: Path) -> None:
    host = Slurm(squeue="4|4|N/A|PENDING|Resources|0|\n6|6|N/A|RUNNING|None|0|\n")
    pending, running = _status(host, _record(tmp_path, "4"), _record(tmp_path, "6"))
    assert (pending.state, pending.reason, pending.started) == ("PENDING", "Resources", None)
    assert running.state == "RUNNING" and host.asked("sacct") == []


def test_while_a_job_runs_only_the_forgotten_ones_ask_sacct(tmp_path: Path) -> None:
    host = Slurm(squeue=SQUEUE.replace("4|4|N/A|PENDING", "4|4|N/A|RUNNING"), sacct=Completed(0, DEV_CLUSTER, ""))
    ended, running, forgotten = _status(host, _record(tmp_path, "3"), _record(tmp_path, "4"), _record(tmp_path, "1"))
    assert (ended.state, ended.exit_code, ended.started) == ("FAILED", 3, None)  # no times while 4 runs
    assert running.state == "RUNNING" and (forgotten.state, forgotten.exit_code) == ("FAILED", 3)
    assert [call[-2] for call in host.asked("sacct")] == ["--jobs=1"]


def test_forgotten_array_tasks_are_one_sacct_of_the_array_and_the_newest_instance_counts() -> None:
    requeued = SACCT + SACCT.splitlines()[3].replace("COMPLETED|0:0", "FAILED|2:0") + "\n"
    host = Slurm(squeue="", sacct=Completed(0, requeued, ""))
    said = with_accounting(host, {}, ["5_0", "5_1", "9"])
    assert host.asked("sacct")[0][-2] == "--jobs=5,9"
    assert said["5_0"]["JobState"] == "FAILED" and said["5_0"]["ExitCode"] == "2:0"
    assert (said["5_1"]["JobState"], said["5_1"]["ExitCode"]) == ("FAILED", "1:0")
    assert "9" not in said  # neither knows job 9: its run directory tells, as before
    assert slurm_status(said["5_1"], None).exit_code == 1


@pytest.mark.parametrize(
    "answer, why",
    [
        (DISABLED, "Slurm accounting storage is disabled"),
        (DBD_DOWN, "sacct: error: Problem talking to the database: Connection refused"),
        (SchedulerError("sacct: command not found"), "sacct: command not found"),
        (SchedulerError("env -u SACCT_FORMAT sacct: no answer within 30 s"), "no answer within 30 s"),
    ],
)
def test_without_accounting_the_run_directory_tells_as_before_and_says_why(tmp_path: Path, answer, why: str) -> None:
    host = Slurm(squeue="", sacct=answer)
    done, failed, lost = _status(
        host, _record(tmp_path, "10", exit_code=0), _record(tmp_path, "11", exit_code=1), _record(tmp_path, "12")
    )
    assert (done.state, done.exit_code, failed.state, failed.exit_code, lost.state) == (
        "COMPLETED",
        0,
        "FAILED",
        1,
        "UNKNOWN",
    )
    assert why in done.accounting and "\n" not in done.accounting
    assert done.accounting == failed.accounting == lost.accounting and done.started is None


def test_status_prints_the_times_and_the_missing_accounting_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "runs"
    ended = _record(runs, "3")
    _record(runs, "20", exit_code=0), _record(runs, "21", exit_code=1)
    monkeypatch.setattr(slurm, "open_scheduler", lambda *_: contextlib.nullcontext(SlurmScheduler(Slurm())))
    assert main(["status", "--runs-dir", str(runs), ended.run_dir]) == 0
    out = capsys.readouterr().out
    assert "FAILED  exit 3  (NonZeroExitCode)" in out
    assert (
        "  times:   submitted 2026-11-27 04:17:47, started 2026-11-27 04:17:47, ended 2026-11-27 04:17:47, ran 0:00:00"
        in out
    )

    host = Slurm(squeue="", sacct=DISABLED)
    monkeypatch.setattr(slurm, "open_scheduler", lambda *_: contextlib.nullcontext(SlurmScheduler(host)))
    assert main(["status", "--runs-dir", str(runs)]) == 0
    said = capsys.readouterr()
    assert "20  tiny  COMPLETED  exit 0" in said.out and "21  tiny  FAILED  exit 1" in said.out  # as before
    assert said.err.count("no SLURM accounting here") == 1 and len(said.err.splitlines()) == 1
    assert "times:" not in said.out


def test_json_carries_the_times_and_a_login_node_answer_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    record = _record(tmp_path / "runs", "3")
    monkeypatch.setattr(slurm, "open_scheduler", lambda *_: contextlib.nullcontext(SlurmScheduler(Slurm())))
    assert main(["status", "--json", record.run_dir]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["ended"] == "2026-11-27T04:17:47" and said["elapsed_s"] == 0 and said["accounting"] is None
    assert dataclasses.asdict(JobStatus(**said)) == said  # what the SSH adapter makes of it


# --- the dev cluster --------------------------------------------------------------------------------


@pytest.mark.slurm
def test_a_finished_job_in_sacct_and_status_agree_also_once_forgotten(
    dev_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_jobs import submit, wait

    returncode, run_dir, said = submit(tmp_path, TINY)
    assert returncode == 0, said
    job_id = run_dir.name
    sacct = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}", "--format=State,ExitCode"]
    rows: list[str] = []

    def recorded() -> bool:  # slurmctld tells slurmdbd a job's end a moment after it ends
        rows[:] = subprocess.run(sacct, capture_output=True, text=True, check=True).stdout.split()
        return rows == ["COMPLETED|0:0"]

    wait(recorded, 30, f"sacct to record job {job_id} COMPLETED (it says {rows})")
    record = read_record(run_dir)
    (remembered,) = SlurmScheduler().statuses([record])
    assert (remembered.state, remembered.exit_code) == ("COMPLETED", 0) and remembered.started and remembered.ended
    shown = run_cli("status", "--runs-dir", str(tmp_path / "runs"), job_id)
    assert f"{job_id}  tiny-gpt2  COMPLETED  exit 0" in shown.stdout and "  times:   submitted " in shown.stdout, shown

    class Forgetting(LocalHost):  # as after MinJobAge (10 minutes on the dev cluster): squeue no longer lists it
        def run(self, argv, timeout: float = 30.0) -> Completed:
            return Completed(0, "", "") if "squeue" in argv else super().run(argv, timeout)

    (run_dir / EXIT_CODE).unlink()  # only SLURM's accounting can tell now
    (forgotten,) = SlurmScheduler(Forgetting()).statuses([record])
    assert (forgotten.state, forgotten.exit_code, forgotten.accounting) == ("COMPLETED", 0, None)
    assert (forgotten.started, forgotten.ended, forgotten.elapsed_s) == (
        remembered.started,
        remembered.ended,
        remembered.elapsed_s,
    )

    # The same cluster's clients told there is no accounting: the run directory alone, and one line why.
    (run_dir / EXIT_CODE).write_text("0\n")
    without = tmp_path / "slurm.conf"
    without.write_text(Path(dev_cluster).read_text().replace("accounting_storage/slurmdbd", "accounting_storage/none"))
    monkeypatch.setenv("SLURM_CONF", str(without))
    (degraded,) = SlurmScheduler(Forgetting()).statuses([record])
    assert (degraded.state, degraded.exit_code, degraded.started) == ("COMPLETED", 0, None)
    assert "accounting storage is disabled" in degraded.accounting

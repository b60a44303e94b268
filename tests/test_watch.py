"""``clusterkit watch`` against a fake SLURM at the Host seam: which endings it answers (once, with
the supervisor's own retry argv and environment), which it never touches, one squeue per pass, and
at most one retry per failed job when two watchers, or a watcher and the job's supervisor, race
(real processes, a real flock)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterkit.cli.watch import cmd_watch
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers.host import Completed, LocalHost
from clusterkit.schedulers.slurm_watch import watch_pass
from clusterkit.supervisor import recovery
from clusterkit.supervisor.environment import JobEnvironment
from clusterkit.supervisor.plan import LaunchPlan, Recovery, Step

FIRST_JOB = "4242"


class FakeSlurm(LocalHost):
    """squeue (and sacct) say what ``states`` says of each job: "STATE nodes"; sbatch answers the next
    job id and appends its argv to ``log`` (a file: processes share it), after ``delay`` seconds."""

    def __init__(self, states: dict[str, str], log: Path, accounted: dict[str, str] | None = None, delay: float = 0.0):
        self.states, self.accounted, self.log, self.delay = states, accounted or {}, log, delay
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        if "squeue" in argv:
            asked = next(a for a in argv if a.startswith("--jobs=")).removeprefix("--jobs=").split(",")
            return Completed(0, "".join(self._line(j, self.states[j]) for j in asked if j in self.states), "")
        if argv[0] == "sacct":
            asked = next(a for a in argv if a.startswith("--jobs=")).removeprefix("--jobs=").split(",")
            lines = "".join(self._line(j, self.accounted[j]).rstrip("|\n") + "\n" for j in asked if j in self.accounted)
            return Completed(0, lines, "")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return Completed(0, argv[3].replace(",", "\n") + "\n", "")
        if argv[:2] == ["scontrol", "release"]:
            return Completed(0, "", "")
        if argv[0] == "env" and "sbatch" in argv:
            time.sleep(self.delay)
            with self.log.open("a") as log:
                log.write(json.dumps(argv) + "\n")
            return Completed(0, f"{5000 + len(self.log.read_text().splitlines())}\n", "")
        raise AssertionError(f"unexpected command {argv}")

    @staticmethod
    def _line(job_id: str, said: str) -> str:
        state, _, nodes = said.partition(" ")
        return f"{job_id}|{state}|{nodes}|/home/u/work|\n"


def _run(tmp_path: Path, max_retries: int = 2, secrets: bool = False) -> RunRecord:
    run_dir = tmp_path / "runs" / "tiny" / FIRST_JOB
    run_dir.mkdir(parents=True)
    step = Step(name="launch", hosts="train", nodes=2, tasks_per_node=1, argv=("true",))
    plan = LaunchPlan(
        "tiny",
        "job",
        2,
        1,
        step,
        Recovery(signal="USR2", max_requeues=0, max_retries=max_retries, exclude=("bad1",)),
        secrets_file=".secrets.env" if secrets else None,
        secrets=("WANDB_API_KEY",) if secrets else (),
    )
    (run_dir / "plan.json").write_text(plan.to_json())
    (run_dir / "job.sbatch").write_text("#!/bin/bash\n")
    record = RunRecord(FIRST_JOB, "tiny", "slurm", str(run_dir), "r.yaml", 1.0, 2, 1, "torchrun")
    record.write()
    return record


def _retries(record: RunRecord) -> list[dict]:
    path = record.path / "retries.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _sbatched(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    "said, cause, excluded",
    [
        ("NODE_FAIL node2", "NODE_FAIL", "bad1,node2"),
        ("BOOT_FAIL node1,node2", "BOOT_FAIL", "bad1,node1,node2"),
        ("PREEMPTED node1", "PREEMPTED", "bad1"),
        ("FAILED node1", "FAILED", "bad1"),  # no exit_code: the batch shell was killed
        ("CANCELLED node1", "CANCELLED", "bad1"),
    ],
)
def test_each_ending_the_job_cannot_answer_is_resubmitted_once_with_the_supervisors_argv(
    tmp_path: Path, said: str, cause: str, excluded: str
) -> None:
    record = _run(tmp_path, secrets=True)
    (record.path / ".secrets.env").write_text("WANDB_API_KEY=x\0")
    log = tmp_path / "sbatch.log"
    slurm = FakeSlurm({FIRST_JOB: said}, log)
    base = {"PATH": "/usr/bin", "WANDB_API_KEY": "from-my-shell", "HOME": "/home/u"}
    (outcome,) = watch_pass(slurm, [record], base)
    assert outcome.retried.new and outcome.retried.job_id == "5001"
    ((argv),) = _sbatched(log)
    # The retry's environment: the watcher's own, less the run's secrets, plus the two retry variables.
    assert argv[:6] == [
        "env",
        "-u",
        "WANDB_API_KEY",
        "CLUSTERKIT_RETRY=1",
        f"CLUSTERKIT_RETRY_OF={FIRST_JOB}",
        "sbatch",
    ]
    assert argv[6:] == [
        "--parsable",
        "--hold",
        "--export=ALL,CLUSTERKIT_RETRY,CLUSTERKIT_RETRY_OF",
        f"--exclude={excluded}",
        "--chdir=/home/u/work",
        f"--output={record.run_dir}/%j_0_log.out",
        f"--error={record.run_dir}/%j_0_log.err",
        f"{record.run_dir}/job.sbatch",
    ]
    assert ["scontrol", "release", "5001"] in slurm.calls
    (line,) = _retries(record)
    assert line == {
        "retry": 1, "job_id": "5001", "after_job": FIRST_JOB, "excluded": excluded, "node": "", "by": "watch", "cause": cause,
    }  # fmt: skip
    assert outcome.line.startswith(f"watch: run {FIRST_JOB} (job {FIRST_JOB}) ended {cause}")
    assert outcome.line.endswith(f"resubmitted as job 5001 excluding {excluded}")
    # The next pass follows the retry (pending now): nothing more.
    slurm.states["5001"] = "PENDING"
    assert watch_pass(slurm, [record], base) == [] and len(_sbatched(log)) == 1


@pytest.mark.parametrize(
    "said, exit_code",
    [
        ("COMPLETED node1", "0"),
        ("RUNNING node1", None),
        ("PENDING", None),
        ("FAILED node1", "1"),
        ("TIMEOUT node1", None),
    ],
)
def test_runs_the_supervisor_answered_or_that_go_on_are_left_alone(tmp_path: Path, said: str, exit_code) -> None:
    record = _run(tmp_path)
    if exit_code is not None:
        (record.path / "exit_code").write_text(exit_code + "\n")
    log = tmp_path / "sbatch.log"
    assert watch_pass(FakeSlurm({FIRST_JOB: said}, log), [record], {}) == [] and not log.exists()


def test_a_run_cancelled_by_clusterkit_cancel_or_whose_secrets_are_gone_is_never_resubmitted(tmp_path: Path) -> None:
    record = _run(tmp_path / "a")
    (record.path / "cancelled").write_text("1\n")
    log = tmp_path / "sbatch.log"
    assert watch_pass(FakeSlurm({FIRST_JOB: "CANCELLED node1"}, log), [record], {}) == []
    assert watch_pass(FakeSlurm({FIRST_JOB: "NODE_FAIL node1"}, log), [record], {}) == []
    ended = _run(tmp_path / "b", secrets=True)  # the supervisor removed the secrets file: the run ended
    (outcome,) = watch_pass(FakeSlurm({FIRST_JOB: "NODE_FAIL node1"}, log), [ended], {})
    assert not outcome.retried.new and "secrets file is gone" in outcome.line and not log.exists()


def test_max_retries_is_honoured_counting_the_supervisors_retries(tmp_path: Path) -> None:
    record = _run(tmp_path, max_retries=2)
    lines = [{"retry": 1, "job_id": "4300", "after_job": FIRST_JOB, "excluded": "n7", "by": "supervisor"}]
    (record.path / "retries.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = tmp_path / "sbatch.log"
    slurm = FakeSlurm({"4300": "NODE_FAIL node2"}, log)
    (outcome,) = watch_pass(slurm, [record], {})
    assert outcome.retried.new and "--exclude=bad1,n7,node2" in _sbatched(log)[0]
    assert "CLUSTERKIT_RETRY=2" in _sbatched(log)[0] and _retries(record)[-1]["after_job"] == "4300"
    slurm.states["5001"] = "NODE_FAIL node1"  # the second retry's node dies too: max_retries (2) reached
    (outcome,) = watch_pass(slurm, [record], {})
    assert not outcome.retried.new and outcome.line.endswith("not resubmitted: max_retries (2) reached")
    assert len(_sbatched(log)) == 1


def test_one_squeue_per_pass_for_all_runs_and_one_sacct_for_those_it_forgot(tmp_path: Path) -> None:
    records = [_run(tmp_path / str(index)) for index in range(3)]
    for index, record in enumerate(records):  # each its own first job
        moved = RunRecord(str(100 + index), "tiny", "slurm", record.run_dir, "r.yaml", 1.0, 2, 1, "torchrun")
        moved.write()
        records[index] = moved
    log = tmp_path / "sbatch.log"
    slurm = FakeSlurm({"100": "RUNNING n1", "101": "NODE_FAIL n2"}, log, accounted={"102": "NODE_FAIL n3"})
    outcomes = watch_pass(slurm, records, {})
    assert [o.event.job_id for o in outcomes] == ["101", "102"]
    assert sum("squeue" in call for call in slurm.calls) == 1 and sum(call[0] == "sacct" for call in slurm.calls) == 1
    slurm.calls.clear()
    slurm.accounted = {}
    watch_pass(slurm, records[:1], {})  # all known to squeue: no sacct
    assert [call[0] for call in slurm.calls] == ["env"] and "squeue" in slurm.calls[0]


def _watch_once(run_dir: str, log: str) -> None:
    from clusterkit.runs.record import read_record

    watch_pass(FakeSlurm({FIRST_JOB: "NODE_FAIL node2"}, Path(log), delay=0.3), [read_record(Path(run_dir))], {})


class _Supervised(JobEnvironment):
    """The failed job's own supervisor, its sbatch logged where the watcher's is."""

    can_submit = True

    def __init__(self, log: str) -> None:
        super().__init__({"SLURM_JOB_ID": FIRST_JOB, "SLURM_SUBMIT_DIR": "/home/u/work"})
        self.log = Path(log)

    def submit_held(self, argv, env):
        time.sleep(0.3)
        with self.log.open("a") as log:
            log.write(json.dumps(["supervisor", *argv]) + "\n")
        return str(5000 + len(self.log.read_text().splitlines()))

    def release(self, job_id: str) -> bool:
        return True


def _supervisor_retry(run_dir: str, log: str) -> None:
    from clusterkit.supervisor.plan import load_plan

    plan = load_plan((Path(run_dir) / "plan.json").read_text())
    recovery.retry(plan, _Supervised(log), Path(run_dir), ["node1", "node2"], {}, exclude=["node2"])


@pytest.mark.parametrize("racers", [(_watch_once, _watch_once), (_supervisor_retry, _watch_once)])
def test_racing_retries_of_one_failed_job_submit_exactly_one(tmp_path: Path, racers) -> None:
    record = _run(tmp_path)
    log = tmp_path / "sbatch.log"
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=racer, args=(record.run_dir, str(log))) for racer in racers]
    for process in processes:
        process.start()
    for process in processes:
        process.join(30)
    assert [process.exitcode for process in processes] == [0, 0]
    assert len(_sbatched(log)) == 1
    (line,) = _retries(record)
    assert line["after_job"] == FIRST_JOB


def test_the_supervisor_finds_the_watchers_retry_and_keeps_the_secrets_for_it(tmp_path: Path) -> None:
    record = _run(tmp_path)
    log = tmp_path / "sbatch.log"
    _watch_once(record.run_dir, str(log))
    plan_text = (record.path / "plan.json").read_text()
    from clusterkit.supervisor.plan import load_plan

    again = recovery.retry(load_plan(plan_text), _Supervised(str(log)), record.path, [], {}, exclude=["node2"])
    assert again == "5001" and len(_sbatched(log)) == 1  # truthy: the supervisor keeps the secrets file


def test_the_lock_file_is_never_a_fifo_or_link_someone_left(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "retries.lock")
    with pytest.raises(OSError), recovery.retry_lock(tmp_path):
        pass
    (tmp_path / "retries.lock").unlink()
    (tmp_path / "retries.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError), recovery.retry_lock(tmp_path):
        pass
    assert not (tmp_path / "elsewhere").exists()


def _args(**fields) -> argparse.Namespace:
    return argparse.Namespace(
        **{"runs": [], "all": False, "runs_dir": None, "interval": 60.0, "once": True, "json": False, **fields}
    )


def test_the_command_prints_one_line_per_event_json_too_and_exits_130_on_ctrl_c(tmp_path: Path, capsys) -> None:
    record = _run(tmp_path)
    log = tmp_path / "sbatch.log"
    slurm = FakeSlurm({FIRST_JOB: "NODE_FAIL node2"}, log)
    assert cmd_watch(_args(runs=[record.run_dir], json=True), host=slurm) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) | {"run_dir": ""} == {
        "run": FIRST_JOB, "run_dir": "", "job": FIRST_JOB, "cause": "NODE_FAIL", "nodes": ["node2"],
        "resubmitted": True, "new_job": "5001", "excluded": "bad1,node2", "why_not": None,
    }  # fmt: skip

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt

    from clusterkit.cli.parser import run

    slurm.states["5001"] = "RUNNING node1"
    with pytest.raises(KeyboardInterrupt):
        cmd_watch(_args(runs=[record.run_dir], once=False), host=slurm, sleep=interrupted)
    assert run(["watch"]) == 2 and "or --all" in capsys.readouterr().err

"""The job's supervisor in-process, against a fake job environment (the seam the real SLURM and local
executor environments implement): what it runs, in which order, and what it decides after the
launch (exit code, hooks, requeue, retry, secrets file). Steps are real short processes; nothing
here needs SLURM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterkit.supervisor import steps
from clusterkit.supervisor.batch import Supervisor
from clusterkit.supervisor.environment import JobEnvironment, LocalEnvironment, SlurmEnvironment, current
from clusterkit.supervisor.plan import LaunchPlan, PlanError, Recovery, Service, Step, expand, load_plan
from clusterkit.supervisor.recovery import EXIT_PREEMPTED

HOSTS = ["n1", "n2", "n3"]


class FakeJob(JobEnvironment):
    """A job environment whose steps run the shell line the test gives for each step name (the
    argv the supervisor built is recorded), and whose queue is a list."""

    executor = "fake"
    can_requeue = True
    can_submit = True

    def __init__(self, behaviour: dict[str, str], environ: dict[str, str] | None = None, hosts=HOSTS) -> None:
        super().__init__(
            {"SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": "/submit", "PATH": os.environ["PATH"], **(environ or {})}
        )
        self.behaviour, self._hosts = behaviour, list(hosts)
        self.started: list[tuple[str, list[str], dict[str, str]]] = []
        self.requeued: list[str] = []
        self.submitted: list[tuple[list[str], dict[str, str]]] = []
        self.released: list[str] = []

    def hosts(self) -> list[str]:
        return self._hosts

    def spawn(self, argv, env):
        name = argv[-1] if argv[0] == "srun" and "node" in argv else "batch" if argv[0] != "srun" else "check"
        self.started.append((name, list(argv), dict(env)))
        return subprocess.Popen(["sh", "-c", self.behaviour.get(name, "exit 0")], env=dict(env))

    def requeue(self) -> bool:
        self.requeued.append(self.job_id)
        return True

    def submit_held(self, argv, env):
        self.submitted.append((list(argv), dict(env)))
        return "5000"

    def release(self, job_id: str) -> bool:
        self.released.append(job_id)
        return True


def _step(name: str = "launch", **fields) -> Step:
    return Step(
        **{
            "name": name,
            "hosts": "train",
            "nodes": 2,
            "tasks_per_node": 1,
            "argv": ("true",),
            "logs": ("%j_%t_log.out", "%j_%t_log.err"),
            **fields,
        }
    )


def _plan(**fields) -> LaunchPlan:
    return LaunchPlan(
        **{
            "job_name": "t",
            "job_kind": "job",
            "train_nodes": 2,
            "slots_per_node": 2,
            "launch": _step(),
            "recovery": Recovery(signal="USR2", max_requeues=2, max_retries=0),
            **fields,
        }
    )


def _supervise(tmp_path: Path, plan: LaunchPlan, job: FakeJob) -> tuple[int, Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "plan.json").write_text(plan.to_json())
    return Supervisor(plan, job, run_dir, run_dir).run(), run_dir


def _names(job: FakeJob) -> list[str]:
    return [name for name, _, _ in job.started]


def test_the_plan_reads_back_as_written_and_a_damaged_one_is_refused() -> None:
    plan = _plan(
        service=Service(
            step=_step("service", hosts="service", nodes=1), port=80, ready_timeout_s=5, address_env="ADDR"
        ),
        preflight=_step("preflight"),
        pre_launch=("echo hi",),
    )
    assert load_plan(plan.to_json()) == plan
    for text, said in (
        ("{", "not JSON"),
        ('{"format": 99}', "format 99"),
        (plan.to_json().replace('"job_kind"', '"jobkind"'), "unknown fields ['jobkind']"),
    ):
        with pytest.raises(PlanError, match=said.replace("[", r"\[")):
            load_plan(text)


def test_run_time_values_are_filled_in_one_pass_and_other_braces_stay() -> None:
    values = {"run_dir": "/r/{rank}", "rank": "3"}
    assert expand("{run_dir}/x-{rank}-{nope}-{{rank}}", values) == "/r/{rank}/x-3-{nope}-{3}"
    assert expand("{node_rank}", values) == "{node_rank}"  # not known here: stays for the node agent


def test_the_rendezvous_port_moves_off_a_busy_one_and_stops_after_twenty_tries() -> None:
    busy = {14242, 14242 + 997}
    assert steps.free_port("4242", "h", lambda host, port: port in busy) == 14242 + 2 * 997
    assert steps.free_port("20042", "h", lambda host, port: False) == 10042
    tried = []
    steps.free_port("1", "h", lambda host, port: tried.append(port) or True)
    assert len(tried) == 20 and len(set(tried)) == 20


def test_a_step_runs_its_node_agent_on_its_own_hosts_with_its_layout_and_logs() -> None:
    plan = _plan(
        service_nodes=1,
        launch=_step(srun=("--cpus-per-task=2", "--container-mounts={run_dir}:{run_dir}"), srun_expand=(1,)),
    )
    argv = steps.srun_argv(plan, plan.launch, HOSTS, "/r d", {"run_dir": "/r d"}, ["/usr/bin/python3"])
    assert argv == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=n1,n2",
        "--cpus-per-task=2",
        "--container-mounts=/r d:/r d",
        "--open-mode=append",
        "--output=/r d/%j_%t_log.out",
        "--error=/r d/%j_%t_log.err",
        "/usr/bin/python3",
        "/r d/supervisor",
        "node",
        "/r d/plan.json",
        "launch",
    ]
    service = _step("service", hosts="service", nodes=1)
    assert "--nodelist=n3" in steps.srun_argv(plan, service, HOSTS, "/r", {}, ["py"])
    bare = _step("image-check", hosts="first", nodes=1, agent=False, argv=("py", "-c", "{run_dir}"), expand=(2,))
    assert steps.srun_argv(plan, bare, HOSTS, "/r", {"run_dir": "/r"}, ["py"])[-3:] == ["py", "-c", "/r"]


def test_a_successful_run_writes_the_hostfile_and_exit_code_and_ends_the_secrets_file(tmp_path: Path) -> None:
    job = FakeJob({})
    (tmp_path / "run").mkdir()
    secrets = tmp_path / "run" / ".secrets.env"
    secrets.write_text("A=1\0")
    code, run_dir = _supervise(tmp_path, _plan(secrets_file=".secrets.env", secrets=("A",)), job)
    assert code == 0 and (run_dir / "exit_code").read_text() == "0\n"
    assert (run_dir / "hostfile").read_text() == "n1 slots=2\nn2 slots=2\n"
    assert _names(job) == ["launch"] and not secrets.exists()
    env = job.started[0][2]
    assert env["MASTER_ADDR"] == "n1" and env["MASTER_PORT"] == str(10000 + 4242) and env["CLUSTERKIT_JOB_ID"] == "4242"


def test_pre_launch_hooks_export_to_the_launch_and_a_failing_one_stops_before_it(tmp_path: Path) -> None:
    job = FakeJob({})
    code, _ = _supervise(tmp_path, _plan(pre_launch=('export TOKEN="$(echo a b)"', "UNSET_IS_FINE=$NOPE")), job)
    assert code == 0 and job.started[0][2]["TOKEN"] == "a b"
    job = FakeJob({})
    code, run_dir = _supervise(tmp_path, _plan(pre_launch=("false", "echo never")), job)
    assert code == 1 and job.started == [] and (run_dir / "exit_code").read_text() == "1\n"


def test_post_run_hooks_see_the_exit_code_and_cannot_change_it(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    code, _ = _supervise(
        tmp_path, _plan(post_run=(f"echo $CLUSTERKIT_EXIT_CODE > {seen}", "exit 9")), FakeJob({"launch": "exit 3"})
    )
    assert code == 3 and seen.read_text() == "3\n"


def _fail_on_node(run_dir: Path, node: int, when: float = 1.0) -> str:
    return f"mkdir -p {run_dir}/ranks && echo '{when} 1' > {run_dir}/ranks/node{node}.exit; exit 1"


def test_a_failed_launch_is_retried_as_a_held_job_without_every_node_excluded_so_far(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "retries.jsonl").write_text(json.dumps({"retry": 1, "job_id": "4242", "excluded": "n7"}) + "\n")
    (run_dir / ".secrets.env").write_text("A=1\0")
    job = FakeJob(
        {"launch": _fail_on_node(run_dir, 1)}, {"CLUSTERKIT_RETRY": "1", "CLUSTERKIT_RETRY_OF": "4000", "A": "secret"}
    )
    plan = _plan(
        recovery=Recovery(signal="USR2", max_requeues=0, max_retries=2, exclude=("n[8-9]",)),
        secrets_file=".secrets.env",
        secrets=("A",),
    )
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 1 and job.released == ["5000"]
    ((argv, env),) = job.submitted
    assert "--exclude=n[8-9],n7,n2" in argv and argv[-1] == f"{run_dir}/job.sbatch" and "--hold" in argv
    assert env["CLUSTERKIT_RETRY"] == "2" and env["CLUSTERKIT_RETRY_OF"] == "4000" and "A" not in env
    last = json.loads((run_dir / "retries.jsonl").read_text().splitlines()[-1])
    assert last == {
        "retry": 2,
        "job_id": "5000",
        "after_job": "4242",
        "excluded": "n[8-9],n7,n2",
        "node": "1",
        "by": "supervisor",
    }
    assert (run_dir / ".secrets.env").exists()  # the retry reads it


@pytest.mark.parametrize("environ, job_class", [({"CLUSTERKIT_RETRY": "2"}, FakeJob), ({}, None)])
def test_no_retry_past_max_retries_or_where_nothing_can_queue_one(tmp_path: Path, environ, job_class) -> None:
    job = FakeJob({"launch": "exit 1"}, environ)
    if job_class is None:
        job.can_submit = False
    code, _ = _supervise(tmp_path, _plan(recovery=Recovery(signal="USR2", max_requeues=0, max_retries=2)), job)
    assert code == 1 and job.submitted == []


def _preempted(run_dir: Path) -> str:
    return f"echo '{{\"step\": 7}}' > {run_dir}/preempted.json; exit 0"  # the ranks stop cleanly


def test_a_preempted_run_is_requeued_from_the_batch_host_and_leaves_no_outcome(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".secrets.env").write_text("A=1\0")
    job = FakeJob(
        {"launch": _preempted(run_dir)},
        {"SLURM_RESTART_COUNT": "1", "SLURM_ARRAY_JOB_ID": "4200", "SLURM_ARRAY_TASK_ID": "3"},
    )
    code, _ = _supervise(tmp_path, _plan(secrets_file=".secrets.env"), job)
    # An array task is requeued by its own id: the array's id would requeue every task.
    assert code == 0 and job.requeued == ["4200_3"]
    assert not (run_dir / "preempted.json").exists() and not (run_dir / "exit_code").exists()
    assert (run_dir / ".secrets.env").exists()


def test_past_max_requeues_a_preempted_run_stops_with_why_and_is_not_retried(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({"launch": _preempted(run_dir)}, {"SLURM_RESTART_COUNT": "2"})
    code, _ = _supervise(tmp_path, _plan(recovery=Recovery(signal="USR2", max_requeues=2, max_retries=3)), job)
    record = json.loads((run_dir / "preempted.json").read_text())
    assert code == EXIT_PREEMPTED and job.requeued == [] and job.submitted == []
    assert record == {"step": 7, "restarts": 2, "max_requeues": 2, "reason": "max_requeues (2) reached"}


def test_a_service_that_ends_before_it_answers_stops_the_job_before_training(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(steps, "answers", lambda host, port, timeout_s=1.0: False)
    service = Service(step=_step("service", hosts="service", nodes=1), port=9, ready_timeout_s=60, address_env="ADDR")
    job = FakeJob({"service": "exit 0"})
    code, run_dir = _supervise(tmp_path, _plan(service=service, service_nodes=1), job)
    assert code == 1 and _names(job) == ["service"] and (run_dir / "exit_code").read_text() == "1\n"


def test_training_starts_once_the_service_answers_and_gets_its_address(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(steps, "answers", lambda host, port, timeout_s=1.0: (host, port) == ("n3", 9))
    service = Service(step=_step("service", hosts="service", nodes=1), port=9, ready_timeout_s=60, address_env="ADDR")
    job = FakeJob({"service": "sleep 30"})
    started = time.monotonic()
    code, _ = _supervise(tmp_path, _plan(service=service, service_nodes=1), job)
    assert code == 0 and _names(job) == ["service", "launch"] and job.started[1][2]["ADDR"] == "n3:9"
    assert time.monotonic() - started < 10  # the service was stopped, not waited for


def test_a_slow_preflight_with_on_slow_exclude_retries_without_the_slow_nodes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "preflight.json").write_text(json.dumps({"slow_nodes": [1]}))
    # Every node's preflight ends 3 together; node 0's record happens to be the earliest.
    ranks = run_dir / "ranks"
    job = FakeJob(
        {"preflight": f"mkdir -p {ranks}; echo '1.0 3' > {ranks}/node0.exit; echo '2.0 3' > {ranks}/node1.exit; exit 3"}
    )
    plan = _plan(
        preflight=_step("preflight"),
        recovery=Recovery(signal="USR2", max_requeues=0, max_retries=1, slow_nodes_excluded=True),
    )
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 3 and _names(job) == ["preflight"]
    argv = job.submitted[0][0]
    assert "--exclude=n2" in argv and not [word for word in argv if word.startswith("--exclude=") and "n1" in word]


def test_the_preemption_signal_reaches_the_running_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    got = run_dir / "got"
    # The step stands in for srun: it records the signal it is passed and ends.
    job = FakeJob({"launch": f"trap 'echo USR2 > {got}; exit 0' USR2; while :; do sleep 0.05; done"})
    plan = _plan()
    supervisor = Supervisor(plan, job, run_dir, run_dir)
    import threading

    def preempt_soon() -> None:
        while supervisor.running is None:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGUSR2)

    threading.Thread(target=preempt_soon, daemon=True).start()
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert supervisor.run() == 0
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert got.read_text() == "USR2\n"


def test_the_environments_read_slurm_and_the_local_executor() -> None:
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "x", "SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.2"}
    assert isinstance(current(environ), SlurmEnvironment) and current(environ).restarts == 0
    local = current({**environ, "CLUSTERKIT_EXECUTOR": "local"})
    assert isinstance(local, LocalEnvironment) and not local.can_requeue and not local.can_submit
    assert local.hosts() == ["127.0.0.1", "127.0.0.2"] and local.job_id == "12"
    assert current({**environ, "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}).job_id == "10_2"


def test_an_array_task_brings_its_arrays_files_into_its_run_directory(tmp_path: Path) -> None:
    files = tmp_path / "array"
    (files / "supervisor").mkdir(parents=True)
    (files / "supervisor" / "x.py").write_text("# supervisor\n")
    (files / "job.json").write_text("{}")
    plan = _plan(job_kind="array", rank_files=("job.json",))
    (files / "plan.json").write_text(plan.to_json())
    run_dir = files / "3"
    run_dir.mkdir()
    assert Supervisor(plan, FakeJob({}), files, run_dir).run() == 0
    assert (run_dir / "job.json").read_text() == "{}" and (run_dir / "supervisor" / "x.py").exists()
    assert (run_dir / "plan.json").read_text() == plan.to_json()


def test_too_few_nodes_for_the_plan_is_one_line_and_no_step(tmp_path: Path, capsys) -> None:
    job = FakeJob({}, hosts=["n1"])
    code, _ = _supervise(tmp_path, _plan(), job)
    assert code == 1 and job.started == [] and "the allocation has 1 nodes, the plan needs 2" in capsys.readouterr().out


@pytest.mark.parametrize("accepted", [True, False])
def test_the_supervisor_marks_its_requeue_before_asking_for_it(tmp_path: Path, accepted: bool) -> None:
    """SLURM may let this process reach its end before it stops the requeued job: the marker (which
    keeps the secrets file and the outcome unwritten) is there first; a requeue SLURM refused is no
    requeue, the marker goes again, and the run ends with why."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seen = []

    class Requeue(FakeJob):
        def requeue(self) -> bool:
            seen.append((run_dir / "requeued").exists())
            return accepted

    job = Requeue({"launch": _preempted(run_dir)})
    code, _ = _supervise(tmp_path, _plan(), job)
    assert seen == [True] and (run_dir / "requeued").exists() == accepted
    assert code == (0 if accepted else EXIT_PREEMPTED)
    if not accepted:
        assert json.loads((run_dir / "preempted.json").read_text())["reason"] == "scontrol requeue failed"


def test_a_slow_preflight_with_on_slow_fail_stops_without_a_retry(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "preflight.json").write_text(json.dumps({"slow_nodes": [1]}))
    job = FakeJob({"preflight": "exit 3"})
    plan = _plan(preflight=_step("preflight"), recovery=Recovery(signal="USR2", max_requeues=0, max_retries=1))
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 3 and job.submitted == [] and (run_dir / "exit_code").read_text() == "3\n"


def test_a_preemption_signal_before_the_launch_reaches_the_launch(tmp_path: Path) -> None:
    """The warning can come while the hooks or the preflight run: this process does not die of the
    signal's default action, and the launch starts knowing (its node agents pass the signal on once
    the ranks handle it: tests/test_node_agent.py)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({})
    plan = _plan(pre_launch=(f"kill -USR2 {os.getpid()}", "sleep 0.2"))
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert Supervisor(plan, job, run_dir, run_dir).run() == 0
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert job.started[0][0] == "launch" and job.started[0][2]["CLUSTERKIT_PREEMPTED"] == "1"

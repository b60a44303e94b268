"""clusterkit exec and shell, into a running job: the exact srun argv that reaches the Host seam (SLURM
here and over SSH), the node chosen by index, host name or rank (from the run's plan), the one-line
refusals (a job not running, no command, no such job, node or rank), hostile values arriving as
literal argv words through a real shell, and the local executor's exec on a real job."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from clusterkit.cli.parser import build_parser
from clusterkit.cli.parser import run as run_clusterkit
from clusterkit.errors import SchedulerError
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers import slurm
from clusterkit.schedulers.host import Completed, LocalHost, attached
from clusterkit.schedulers.ssh import SSHHost
from clusterkit.schedulers.ssh_transport import Session
from clusterkit.spec.profile import Login
from clusterkit.supervisor.plan import LaunchPlan, Recovery, Step
from conftest import REPO, run_cli

HOSTILE = ["$(touch pwned)", "`id`", "a'b\"c", "line\nbreak", "; rm -rf ~", "--node", "-w", "*", ""]
HOLD = str(REPO / "tests" / "scripts" / "hold_node.py")


class FakeSlurm(LocalHost):
    """SLURM as the adapter sees it through its Host: squeue, sacct and scontrol answer as told, and what
    would run with the terminal (srun) is recorded, not run."""

    def __init__(self, state: str = "RUNNING", hosts: Sequence[str] = ("node1", "node2"), code: int = 0):
        self.state, self.hosts, self.code = state, list(hosts), code
        self.calls: list[list[str]] = []
        self.attached: list[tuple[list[str], bool]] = []

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        if "squeue" in argv:
            job = argv[-2].removeprefix("--jobs=")
            return Completed(0, f"{job}|{job}|N/A|{self.state}|None|0|\n", "")
        if "sacct" in argv:  # an ended job's times: the accounting database has nothing more here
            return Completed(0, "", "")
        if argv[:3] == ["scontrol", "--oneliner", "show"]:
            nodelist = f"node[1-{len(self.hosts)}]"
            return Completed(0, f"JobId={argv[-1]} JobName=t JobState={self.state} NodeList={nodelist}\n", "")
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return Completed(0, "".join(f"{host}\n" for host in self.hosts), "")
        raise AssertionError(f"unexpected command {argv}")

    def attach(self, argv: Sequence[str], tty: bool = False) -> int:
        self.attached.append((list(argv), tty))
        return self.code


def _plan(train_nodes: int = 2, slots_per_node: int = 4) -> LaunchPlan:
    step = Step(name="launch", hosts="train", nodes=train_nodes, tasks_per_node=1, argv=("true",))
    recovery = Recovery(signal="USR2", max_requeues=0, max_retries=0)
    return LaunchPlan("t", "job", train_nodes, slots_per_node, step, recovery)


def _run(tmp_path: Path, scheduler: str = "slurm", plan: LaunchPlan | None = None, **fields) -> RunRecord:
    run_dir = tmp_path / "runs" / "t" / "4242"
    run_dir.mkdir(parents=True)
    record = RunRecord(
        **{
            "job_id": "4242",
            "name": "t",
            "scheduler": scheduler,
            "run_dir": str(run_dir),
            "recipe": "t.yaml",
            "submitted_at": time.time(),
            "nodes": 2,
            "ranks_per_node": 4,
            "launcher": "torchrun",
            **fields,
        }
    )
    record.write()
    (run_dir / "plan.json").write_text((plan or _plan()).to_json())
    return record


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    host = FakeSlurm()

    @contextlib.contextmanager
    def open_scheduler(login=None, accept_new_host_key=False) -> Iterator[slurm.SlurmScheduler]:
        yield slurm.SlurmScheduler(host)

    monkeypatch.setattr(slurm, "open_scheduler", open_scheduler)
    return host


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch):
    """Call it in the test (capture swaps sys.stdout after the fixtures): as if clusterkit ran in a
    terminal, which pytest's stdin and stdout are not."""

    def in_a_terminal() -> None:
        for stream in ("stdin", "stdout"):
            monkeypatch.setattr(getattr(sys, stream), "isatty", lambda: True, raising=False)

    return in_a_terminal


def _clusterkit(tmp_path: Path, *args: str) -> int:
    return run_clusterkit([args[0], "--runs-dir", str(tmp_path / "runs"), *args[1:]])


def _srun(job: str, host: str, *command: str) -> list[str]:
    return ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1", "-w", host, "--", *command]


# --- SLURM here, through the Host seam --------------------------------------------------------------


def test_exec_sends_one_srun_step_into_the_allocation_on_node_0_by_default(tmp_path, fake_slurm, capsys) -> None:
    _run(tmp_path)
    fake_slurm.code = 7
    assert _clusterkit(tmp_path, "exec", "4242", "--", "nvidia-smi", "-L") == 7  # the command's exit status
    assert fake_slurm.attached == [(_srun("4242", "node1", "nvidia-smi", "-L"), False)]
    # Its nodes from SLURM itself, in SLURM_NODEID order.
    assert ["scontrol", "--oneliner", "show", "job", "4242"] in fake_slurm.calls
    assert ["scontrol", "show", "hostnames", "node[1-2]"] in fake_slurm.calls
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "choice,host",
    [
        (["--node", "1"], "node2"),
        (["--node", "node2"], "node2"),
        (["--rank", "0"], "node1"),
        (["--rank", "3"], "node1"),
        (["--rank", "4"], "node2"),  # node-major, 4 ranks a node (the plan's slots_per_node)
        (["--rank", "7"], "node2"),
    ],
)
def test_the_node_by_index_host_name_or_rank(tmp_path, fake_slurm, choice, host) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", "4242", *choice, "--", "hostname") == 0
    assert fake_slurm.attached == [(_srun("4242", host, "hostname"), False)]


@pytest.mark.parametrize(
    "choice,said",
    [
        (["--node", "2"], "job 4242 has no node 2: its nodes are 0 node1, 1 node2"),
        (["--node", "node9"], "job 4242 runs on no host 'node9': its nodes are 0 node1, 1 node2"),
        (["--node", "node1\n; id"], "job 4242 runs on no host 'node1\\n; id'"),
        (["--node", "-1"], "job 4242 runs on no host '-1'"),
        (["--node", "١"], "job 4242 runs on no host '١'"),  # a digit, but not SLURM_NODEID's
        (["--rank", "8"], "job 4242 has no rank 8 (ranks 0-7)"),
        (["--rank", "-1"], "job 4242 has no rank -1 (ranks 0-7)"),
    ],
)
def test_a_node_or_rank_the_job_lacks_is_one_line_exit_2(tmp_path, fake_slurm, capsys, choice, said) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", "4242", *choice, "--", "hostname") == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert fake_slurm.attached == []


def test_rank_without_a_readable_plan_is_refused_and_node_still_works(tmp_path, fake_slurm, capsys) -> None:
    record = _run(tmp_path)
    (record.path / "plan.json").write_text("{damaged")
    assert _clusterkit(tmp_path, "exec", "4242", "--rank", "1", "--", "hostname") == 2
    err = capsys.readouterr().err
    assert "--rank needs the run's plan.json" in err and "give --node instead" in err and err.count("\n") == 1
    assert _clusterkit(tmp_path, "exec", "4242", "--node", "1", "--", "hostname") == 0


def test_a_plan_larger_than_its_allocation_never_picks_a_wrong_node(tmp_path, fake_slurm, capsys) -> None:
    _run(tmp_path, plan=_plan(train_nodes=3, slots_per_node=1))
    assert _clusterkit(tmp_path, "exec", "4242", "--rank", "2", "--", "hostname") == 2
    assert "rank 2 is on node 2, but the job has 2 nodes" in capsys.readouterr().err
    assert fake_slurm.attached == []


@pytest.mark.parametrize("state", ["PENDING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"])
def test_a_job_that_is_not_running_is_refused_naming_its_state(tmp_path, fake_slurm, capsys, terminal, state) -> None:
    _run(tmp_path)
    terminal()
    fake_slurm.state = state
    for command in (("exec", "4242", "--", "hostname"), ("shell", "4242")):
        assert _clusterkit(tmp_path, *command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"clusterkit: job 4242 is {state}") and err.count("\n") == 1, err
        assert f"{command[0]} needs a running job" in err
    assert fake_slurm.attached == []


def test_a_job_slurm_no_longer_knows_is_unknown_and_refused(tmp_path, fake_slurm, capsys) -> None:
    fake_slurm.run = lambda argv, timeout=30.0: Completed(0, "", "")  # type: ignore[method-assign]  # squeue: no line
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", "4242", "--", "hostname") == 2
    assert capsys.readouterr().err.startswith("clusterkit: job 4242 is UNKNOWN")
    assert fake_slurm.attached == []


def test_a_retried_run_is_entered_through_its_newest_retry(tmp_path, fake_slurm) -> None:
    record = _run(tmp_path)
    (record.path / "retries.jsonl").write_text(json.dumps({"retry": 1, "job_id": "4250"}) + "\n")
    assert _clusterkit(tmp_path, "exec", "4242", "--node", "1", "--", "hostname") == 0
    assert ["scontrol", "--oneliner", "show", "job", "4250"] in fake_slurm.calls
    assert fake_slurm.attached == [(_srun("4250", "node2", "hostname"), False)]


def test_hostile_command_words_reach_srun_as_they_are(tmp_path, fake_slurm) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", "4242", "--", *HOSTILE) == 0
    assert fake_slurm.attached == [(_srun("4242", "node1", *HOSTILE), False)]


@pytest.mark.parametrize("job", ["42 42", "4242\n", "4242;id", "$(id)", "../4242", "*"])
def test_a_job_that_is_no_clusterkit_run_is_one_line_exit_2(tmp_path, fake_slurm, capsys, job) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", job, "--", "hostname") == 2
    err = capsys.readouterr().err
    assert "no run with job id" in err and err.count("\n") == 1, err
    assert fake_slurm.calls == [] and fake_slurm.attached == []


def test_no_command_is_refused_in_one_line(tmp_path, fake_slurm, capsys) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "exec", "4242", "--") == 2
    assert (
        capsys.readouterr().err
        == "clusterkit: exec: give the command after --, e.g. clusterkit exec 4242 -- nvidia-smi\n"
    )
    assert _clusterkit(tmp_path, "exec", "4242") == 2
    assert "put -- before the command" in capsys.readouterr().err
    assert fake_slurm.calls == []


def test_everything_after_the_first_dashes_is_the_command_whatever_it_looks_like() -> None:
    args = build_parser().parse_args(["exec", "4242", "--node", "1", "--", "ls", "--node", "x", "--", "-h"])
    assert (args.command, args.job, args.node, args.command_argv) == (
        "exec",
        "4242",
        "1",
        ["ls", "--node", "x", "--", "-h"],
    )
    args = build_parser().parse_args(["exec", "--rank", "3", "4242", "--", "--"])
    assert (args.rank, args.command_argv) == (3, ["--"])


def test_a_job_array_is_refused_naming_a_task(tmp_path, fake_slurm, capsys) -> None:
    _run(tmp_path, tasks=(0, 1))
    assert _clusterkit(tmp_path, "exec", "4242", "--", "hostname") == 2
    assert "give one, e.g. clusterkit exec 4242_0" in capsys.readouterr().err


def test_shell_is_srun_pty_bash_login_on_the_node(tmp_path, fake_slurm, terminal) -> None:
    _run(tmp_path)
    terminal()
    assert _clusterkit(tmp_path, "shell", "4242", "--node", "1") == 0
    argv = ["srun", "--jobid=4242", "--overlap", "--nodes=1", "--ntasks=1", "--pty", "-w", "node2", "--", "bash", "-l"]
    assert fake_slurm.attached == [(argv, True)]


def test_shell_without_a_terminal_is_refused(tmp_path, fake_slurm, capsys) -> None:
    _run(tmp_path)
    assert _clusterkit(tmp_path, "shell", "4242") == 2  # pytest's stdin is no terminal
    assert "shell needs a terminal" in capsys.readouterr().err
    assert fake_slurm.attached == []


# --- over SSH: the same argv, every word quoted, through a real shell ------------------------------------


class RecordingSession(Session):
    """A transport that runs each command line in a real local shell, as the login node would."""

    def __init__(self, srun_dir: Path) -> None:
        self.endpoint = type("Endpoint", (), {"host": "login"})()
        self.env = dict(os.environ, PATH=f"{srun_dir}{os.pathsep}{os.environ['PATH']}")
        self.lines: list[str] = []

    def run(self, command, timeout=120.0, stdin=None, stdout=None, stderr=None) -> Completed:
        self.lines.append(command)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=self.env, check=False)
        return Completed(done.returncode, done.stdout, done.stderr)


def test_over_ssh_the_srun_argv_arrives_word_for_word_through_the_login_shell(tmp_path) -> None:
    bin_dir, workdir = tmp_path / "bin", tmp_path / "work dir"
    bin_dir.mkdir()
    workdir.mkdir()
    said = tmp_path / "srun-argv.json"
    (bin_dir / "srun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(said)!r}, 'w').write(json.dumps([os.getcwd(), *sys.argv[1:]]))\nsys.exit(5)\n"
    )
    (bin_dir / "srun").chmod(0o755)
    session = RecordingSession(bin_dir)
    host = SSHHost(session, Login(host="login"))
    host.__dict__["workdir"] = str(workdir)  # as the login node's remote_workdir resolves
    argv = slurm.exec_argv("4242", "node2", HOSTILE)
    assert host.attach(argv) == 5  # srun's exit status, through the transport
    assert json.loads(said.read_text()) == [str(workdir), *argv[1:]]
    assert not list(tmp_path.rglob("pwned"))
    assert session.lines == [f"cd -- {shlex.quote(str(workdir))} && {shlex.join(argv)}"]


def test_a_transport_without_terminals_refuses_shell_in_one_line() -> None:
    from clusterkit.errors import UsageError

    class ParamikoSession(Session):  # as the paramiko transport: the base class's attach
        endpoint = type("Endpoint", (), {"host": "login"})()

    with pytest.raises(UsageError) as refused:
        ParamikoSession().attach("srun --pty bash -l", tty=True)
    assert "the paramiko SSH transport cannot give a command on login a terminal" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_openssh_asks_for_a_terminal_only_for_shell(monkeypatch) -> None:
    from clusterkit.schedulers import openssh_transport

    session = object.__new__(openssh_transport.OpenSSHSession)
    session.argv, session.env = ["ssh", "-T", "-o", "BatchMode=no"], {"A": "1"}
    session.login = Login(host="login")
    ran: list[list[str]] = []
    monkeypatch.setattr(openssh_transport, "attached", lambda argv, env: ran.append(argv) or 4)
    assert session.attach("LINE", tty=True) == 4 and session.attach("LINE") == 4
    assert ran == [
        ["ssh", "-t", "-o", "BatchMode=no", "--", "login", "LINE"],
        ["ssh", "-T", "-o", "BatchMode=no", "--", "login", "LINE"],
    ]


def test_ctrl_c_is_the_commands_and_clusterkit_waits_for_its_end() -> None:
    """SIGINT reaching clusterkit too (the terminal sends it to both) neither raises here nor kills
    the command: srun decides (its first Ctrl-C only reports); its exit status is the answer."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    ctrl_c = "import os, signal, time; os.kill(os.getppid(), signal.SIGINT); time.sleep(0.5); raise SystemExit(3)"
    assert attached([sys.executable, "-c", ctrl_c]) == 3
    assert signal.getsignal(signal.SIGINT) is before
    assert attached([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]) == 128 + 15
    with pytest.raises(SchedulerError, match="no-such-program: command not found"):
        attached(["no-such-program"])


# --- the local executor: a real job ---------------------------------------------------------------------


def _local_job(tmp_path: Path) -> dict:
    body = {
        "name": "hold",
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": HOLD},
        "snapshot": False,
    }
    recipe = tmp_path / "hold.yaml"
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["run"]
    deadline = time.monotonic() + 60
    while len(list(Path(record["run_dir"]).glob("started-*"))) < 2:
        assert time.monotonic() < deadline, "the local job did not start"
        time.sleep(0.2)
    return record


def test_local_exec_runs_here_in_the_run_dir_as_the_node_and_ends_with_the_job(tmp_path) -> None:
    record = _local_job(tmp_path)
    job, runs = record["job_id"], str(tmp_path / "runs")
    show = "import json, os, sys; print(json.dumps([os.getcwd(), os.environ['SLURM_NODEID'], os.environ['SLURMD_NODENAME'], os.environ['CLUSTERKIT_LOCAL_JOB'], sys.argv[1:]])); sys.exit(9)"
    try:
        done = run_cli(
            "exec", job, "--runs-dir", runs, "--node", "1", "--", sys.executable, "-c", show, *HOSTILE, cwd=tmp_path
        )
        assert done.returncode == 9, done.stderr
        assert json.loads(done.stdout) == [record["run_dir"], "1", "127.0.0.2", record["run_dir"], HOSTILE]
        assert not (tmp_path / "pwned").exists()
        # --rank from the run's plan: 2 ranks a node, rank 3 on node 1; rank 4 is none of the job's.
        done = run_cli("exec", job, "--runs-dir", runs, "--rank", "3", "--", sys.executable, "-c", show, cwd=tmp_path)
        assert json.loads(done.stdout)[1:3] == ["1", "127.0.0.2"]
        done = run_cli("exec", job, "--runs-dir", runs, "--rank", "4", "--", "true", cwd=tmp_path)
        assert done.returncode == 2 and done.stderr == f"clusterkit: job {job} has no rank 4 (ranks 0-3)\n"
    finally:
        assert run_cli("cancel", job, "--runs-dir", runs, cwd=tmp_path).returncode == 0
    done = run_cli("exec", job, "--runs-dir", runs, "--", "true", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr == f"clusterkit: job {job} is CANCELLED: exec needs a running job\n"


# --- the dev cluster: a real allocation (run by the lead: -m slurm) -------------------------------------


@pytest.mark.slurm
def test_exec_runs_in_the_allocation_on_the_chosen_node_and_a_finished_job_is_refused(
    dev_cluster: str, tmp_path: Path
) -> None:
    """While the 2-node tiny job trains, exec --node 1 and --rank 3 (2 ranks a node) are on node2,
    in the job's allocation (its SLURM_JOB_ID), the command's exit status is exec's; once the job has
    ended, exec is refused in one line naming its state. The dev cluster's two slurmd share one
    machine, so SLURMD_NODENAME, not hostname, tells the nodes apart."""
    from slurm_jobs import LONG, events, start, wait

    job_id, run_dir = start(tmp_path, *LONG)
    runs = str(tmp_path / "runs")
    try:
        wait(lambda: events(run_dir, "log"), 180, "the job to train")
        done = run_cli(
            "exec", job_id, "--runs-dir", runs, "--node", "1", "--", "printenv", "SLURMD_NODENAME", "SLURM_JOB_ID",
            cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.split() == ["node2", job_id], done.stdout + done.stderr
        done = run_cli("exec", job_id, "--runs-dir", runs, "--rank", "3", "--", "printenv", "SLURMD_NODENAME", cwd=REPO)
        assert done.stdout.split() == ["node2"], done.stderr
        done = run_cli("exec", job_id, "--runs-dir", runs, "--", "sh", "-c", "echo $SLURMD_NODENAME; exit 7", cwd=REPO)
        assert done.returncode == 7 and done.stdout.split() == ["node1"], done.stderr
    finally:
        run_cli("cancel", job_id, "--runs-dir", runs, cwd=REPO)
    wait(lambda: "CANCELLED" in run_cli("status", job_id, "--runs-dir", runs, cwd=REPO).stdout, 60, "the cancel")
    done = run_cli("exec", job_id, "--runs-dir", runs, "--", "hostname", cwd=REPO)
    assert done.returncode == 2 and done.stderr.startswith(f"clusterkit: job {job_id} is CANCELLED"), done.stderr
    assert done.stderr.count("\n") == 1

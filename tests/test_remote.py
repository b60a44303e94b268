"""Submitting and following jobs over SSH, against real OpenSSH servers on this machine: a login
node (sshd on a free loopback port, key-only) in front of the dev SLURM cluster, and a second sshd as
a ProxyJump bastion. The client has its own HOME: an encrypted key, ~/.ssh/config, known_hosts.
Host keys are checked (RejectPolicy semantics) in every test. The default transport (the system ssh,
with a master connection) carries everything; paramiko the plain submission, the auth errors and the
ssh-agent. tests/test_ssh_transports.py has the transports' own tests (no SLURM needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from slurm_jobs import TINY, assert_real_data_parallel, rank_records
from sshd import SSHServer, client_env, client_home, forget_client, free_port, keygen, stop_masters

pytestmark = pytest.mark.slurm
PASSPHRASE = "tr0ub4dor&3-never-logged"


@dataclass
class Remote:
    root: Path
    home: Path
    laptop: Path  # the client's working directory
    login: SSHServer
    jump: SSHServer

    def env(self, home: Path | None = None, passphrase: str | None = PASSPHRASE) -> dict[str, str]:
        return client_env(home or self.home, passphrase)

    def profile(self, name: str, workdir: str, python: str = sys.executable, **login: object) -> Path:
        """The dev cluster's profile plus a login node; its jobs run this interpreter (the SSH session's
        PATH does not have it)."""
        data = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
        # The jobs run this checkout's clusterkit (the one that rendered job.json), wherever it is.
        data.update(
            name=name,
            python=sys.executable,
            env={**data.get("env", {}), "PYTHONPATH": str(REPO)},
            login={"host": "cluster-login", "remote_workdir": str(self.root / workdir), "python": python, **login},
        )
        path = self.root / "profiles" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, cwd=self.laptop, env=env or self.env(), timeout=timeout)
        self.outputs.append(done.stdout + done.stderr)
        return done

    outputs: list[str]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, dev_cluster: str) -> Iterator[Remote]:
    root = tmp_path_factory.mktemp("remote")
    home, public_key = client_home(root / "home", PASSPHRASE)
    authorized = root / "authorized_keys"
    shutil.copy(public_key, authorized)
    login = SSHServer(root / "sshd-login", authorized, slurm_conf=dev_cluster).start()
    jump = SSHServer(root / "sshd-jump", authorized).start()
    (home / ".ssh" / "known_hosts").write_text(login.known_hosts_line + jump.known_hosts_line)
    # The login node by an alias: HostName, Port, User and IdentityFile all come from ~/.ssh/config.
    (home / ".ssh" / "config").write_text(
        f"Host cluster-login\n  HostName 127.0.0.1\n  Port {login.port}\n  User root\n  IdentityFile ~/.ssh/id_ed25519\n"
    )
    laptop = root / "laptop"
    laptop.mkdir()
    try:
        yield Remote(root, home, laptop, login, jump, outputs=[])
    finally:
        for client in (home, *root.glob("home-*")):
            forget_client(client)
        login.stop()
        jump.stop()


def _job_id(output: str) -> str:
    return next(line.split()[2] for line in output.splitlines() if line.startswith("submitted job "))


def _wait_state(remote: Remote, job_id: str, states: tuple[str, ...], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = remote.cli("status", job_id).stdout
        if any(f"  {state}" in line for state in states):
            return line
        time.sleep(1)
    raise AssertionError(f"job {job_id} never reached {states}: {line}")


def _assert_no_secret(remote: Remote) -> None:
    """The passphrase appears nowhere: no command output, no file the client, the login node or the
    job wrote (rank env dumps included)."""
    for output in remote.outputs:
        assert PASSPHRASE not in output
    for path in remote.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert PASSPHRASE.encode() not in path.read_bytes(), path


def test_submit_follow_logs_status_and_cancel_over_ssh(remote: Remote) -> None:
    profile = remote.profile("prod", "remote")
    done = remote.cli("submit", TINY, "--cluster", str(profile), "--executor", "ssh", "--follow")
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = _job_id(done.stdout)
    run_dir = remote.root / "remote" / "runs" / "tiny-gpt2" / job_id
    assert f"run dir: cluster-login:{run_dir}" in done.stdout
    assert "COMPLETED" in done.stdout and "step 30" in done.stdout  # followed over SSH to the end
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    # The login node's clusterkit submitted exactly the script the local dry run prints.
    dry = remote.cli("submit", TINY, "--cluster", str(profile), "--executor", "ssh", "--dry-run")
    assert dry.returncode == 0 and (run_dir / "job.sbatch").read_text() == dry.stdout
    assert dry.stderr.startswith("# would run: sbatch --parsable --hold runs/tiny-gpt2/.staging-")
    assert not list(run_dir.parent.glob(".staging-*")), "the staging directory became the run directory"
    record = json.loads((remote.laptop / "runs" / "tiny-gpt2" / f"{job_id}@cluster-login" / "run.json").read_text())
    assert record["scheduler"] == "ssh" and record["run_dir"] == str(run_dir)

    status = remote.cli("status", job_id)
    assert f"{job_id}  tiny-gpt2  COMPLETED  exit 0" in status.stdout
    assert f"run dir: cluster-login:{run_dir}" in status.stdout
    logs = remote.cli("logs", job_id)
    assert logs.returncode == 0 and f"clusterkit: job {job_id} on" in logs.stdout
    followed = remote.cli("logs", job_id, "-f", timeout=60)  # streams until the job is over: it is
    assert followed.returncode == 0 and f"clusterkit: job {job_id} on" in followed.stdout
    rank3 = remote.cli("logs", job_id, "--rank", "3")
    assert rank3.returncode == 0 and "attempt_0/1/std" in rank3.stdout
    listing = remote.cli("ls")
    assert job_id in listing.stdout and "COMPLETED" in listing.stdout
    # plot reads metrics.jsonl through the SSH adapter; the PNG is drawn here (the run dir is the login node's).
    plotted = remote.cli("plot", job_id, "--json")
    assert plotted.returncode == 0, plotted.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    loss = [(m["step"], m["loss"]) for m in metrics if m["event"] == "log"]
    series = json.loads(plotted.stdout)["runs"][0]["series"]["loss"]
    assert list(zip(series["steps"], series["values"])) == loss and loss[-1][0] == 30
    assert json.loads(plotted.stdout)["outputs"] == [str(remote.laptop / f"curves-{job_id}.png")]
    # From a directory without runs/: the run index has the local record (scheduler ssh).
    away = run_cli("status", job_id, cwd=remote.home, env=remote.env())
    assert f"{job_id}  tiny-gpt2  COMPLETED" in away.stdout and f"cluster-login:{run_dir}" in away.stdout, away.stderr
    # --resume with the local record continues the run on the cluster, from its newest checkpoint there.
    resumed = remote.cli(
        "submit",
        "--resume",
        str(remote.laptop / "runs" / "tiny-gpt2" / f"{job_id}@cluster-login"),
        "--set",
        "task.trainer.args.max_steps=35",
        "--follow",
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    resumed_dir = remote.root / "remote" / "runs" / "tiny-gpt2" / _job_id(resumed.stdout)
    assert {r["resumed_from"] for r in rank_records(resumed_dir)} == {str(run_dir / "checkpoints" / "checkpoint-30")}

    long_run = remote.cli(
        "submit", TINY, "--cluster", str(profile), "--executor", "ssh", "--set", "task.trainer.args.max_steps=100000"
    )
    assert long_run.returncode == 0, long_run.stderr
    second = _job_id(long_run.stdout)
    _wait_state(remote, second, ("RUNNING",))
    cancel = remote.cli("cancel", second)
    assert cancel.returncode == 0 and f"cancelled job {second}" in cancel.stdout
    _wait_state(remote, second, ("CANCELLED",), timeout=60)
    _assert_no_secret(remote)


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_login_node_without_clusterkit_gets_sbatch_and_the_task_script(remote: Remote, transport: str) -> None:
    """/usr/bin/python3 (Debian's) has no clusterkit: the rendered script goes to sbatch directly,
    and the user's local task script goes with it, in the run directory's code snapshot."""
    without_checkout = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert (
        subprocess.run(
            ["/usr/bin/python3", "-c", "import clusterkit"], cwd="/", capture_output=True, env=without_checkout
        ).returncode
        != 0
    )
    profile = remote.profile(
        f"plain-{transport}", f"remote-plain-{transport}", python="/usr/bin/python3", transport=transport
    )
    (remote.laptop / "tests" / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "scripts" / "echo_contract.py", remote.laptop / "tests" / "scripts")
    recipe = remote.laptop / "contract.yaml"
    shutil.copy(REPO / "tests" / "recipes" / "env-contract.yaml", recipe)
    done = remote.cli("submit", str(recipe), "--cluster", str(profile), "--executor", "ssh", "--follow")
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = _job_id(done.stdout)
    run_dir = remote.root / f"remote-plain-{transport}" / "runs" / "env-contract" / job_id
    # The task script went in the code snapshot (a tar unpacked by the login node's tar), not beside the workdir.
    assert (run_dir / "code" / "echo_contract.py").is_file()
    assert not (remote.root / f"remote-plain-{transport}" / "tests" / "scripts").exists()
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert len(ranks) == 4 and {r["node"] for r in ranks} == {"node1", "node2"}
    assert all(r["argv"] == ["--flag", "value with spaces", f"{run_dir}/out"] for r in ranks)
    assert json.loads((run_dir / "run.json").read_text())["job_id"] == job_id
    status = remote.cli("status", job_id)
    assert f"{job_id}  env-contract  COMPLETED  exit 0" in status.stdout
    for follow in ((), ("-f",)):  # node logs read with cat; -f polls the state through scontrol
        logs = remote.cli("logs", job_id, *follow, timeout=60)
        assert logs.returncode == 0 and f"clusterkit: job {job_id} on" in logs.stdout
        assert f"==> {job_id}_0_log.out <==" in logs.stdout
    rank_logs = remote.cli("logs", job_id, "--rank", "0")
    assert rank_logs.returncode == 1 and "needs clusterkit on 127.0.0.1" in rank_logs.stderr
    _assert_no_secret(remote)


def test_proxy_jump_through_a_bastion(remote: Remote) -> None:
    stop_masters(remote.home)  # a master connection to the login node itself would serve instead
    profile = remote.profile("bastion", "remote", proxy_jump=f"root@127.0.0.1:{remote.jump.port}")
    done = remote.cli("ls", "--cluster", str(profile))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(("JOB", "no runs under"))  # the login node's own listing, via the bastion
    assert f"target 127.0.0.1 port {remote.login.port}" in remote.jump.log.read_text()


def test_unknown_host_key_is_refused_until_accepted(remote: Remote) -> None:
    home, _ = client_home(remote.root / "home-new", PASSPHRASE)
    shutil.copy(remote.home / ".ssh" / "config", home / ".ssh" / "config")
    shutil.copy(remote.home / ".ssh" / "id_ed25519", home / ".ssh" / "id_ed25519")
    shutil.copy(remote.home / ".ssh" / "id_ed25519.pub", home / ".ssh" / "id_ed25519.pub")  # ssh offers it first
    env = remote.env(home)
    profile = remote.profile("fresh", "remote-fresh")
    refused = remote.cli("submit", TINY, "--cluster", str(profile), "--executor", "ssh", env=env)
    assert refused.returncode == 1
    message = refused.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in refused.stderr
    assert f"[127.0.0.1]:{remote.login.port} is not in" in message and "SHA256:" in message
    assert "--accept-new-host-key" in message
    assert not (remote.root / "remote-fresh").exists(), "nothing was uploaded or submitted"

    accepted = remote.cli("ls", "--cluster", str(profile), "--accept-new-host-key", env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert remote.login.known_hosts_line.split()[2] in (home / ".ssh" / "known_hosts").read_text()
    assert remote.cli("ls", "--cluster", str(profile), env=env).returncode == 0

    # A changed key (here: the bastion's key recorded for the login node) is refused even with the flag
    # (once the master connection, whose key was checked when it signed in, is gone).
    _, key_type, key = remote.jump.known_hosts_line.split()
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{remote.login.port} {key_type} {key}\n")
    stop_masters(home)
    changed = remote.cli("ls", "--cluster", str(profile), "--accept-new-host-key", env=env)
    assert changed.returncode == 1 and "has CHANGED" in changed.stderr and "ssh-keygen -R" in changed.stderr


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_wrong_key_or_passphrase_is_a_clear_auth_error(remote: Remote, transport: str) -> None:
    home = remote.root / f"home-wrong-{transport}"
    (home / ".ssh").mkdir(parents=True)
    keygen(home / ".ssh" / "id_ed25519")  # a key the server has never seen
    shutil.copy(remote.home / ".ssh" / "config", home / ".ssh" / "config")
    shutil.copy(remote.home / ".ssh" / "known_hosts", home / ".ssh" / "known_hosts")
    profile = remote.profile(f"wrongkey-{transport}", f"remote-wrong-{transport}", transport=transport)
    done = remote.cli("submit", TINY, "--cluster", str(profile), "--executor", "ssh", env=remote.env(home, None))
    assert done.returncode == 1 and "authentication failed" in done.stderr and "Traceback" not in done.stderr
    assert not (remote.root / f"remote-wrong-{transport}").exists()

    stop_masters(remote.home)  # signed in already, a master would need no passphrase
    bad_passphrase = remote.cli("ls", "--cluster", str(profile), env=remote.env(passphrase="not-it"))
    locked = remote.cli("ls", "--cluster", str(profile), env=remote.env(passphrase=None))
    for refused in (bad_passphrase, locked):
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    if transport == "paramiko":
        assert "wrong passphrase" in bad_passphrase.stderr and "is encrypted: add it to ssh-agent" in locked.stderr
    else:  # ssh says only that the server refused: the message names the ways to unlock a key
        assert all(
            "authentication failed" in r.stderr and "CLUSTERKIT_SSH_PASSPHRASE" in r.stderr
            for r in (bad_passphrase, locked)
        )


def test_sshd_down_is_a_clear_error_within_10_s(remote: Remote) -> None:
    profile = remote.profile("down", "remote-down", port=free_port())  # nothing listens there
    for command in (
        ("submit", TINY, "--cluster", str(profile), "--executor", "ssh"),
        ("ls", "--cluster", str(profile)),
    ):
        started = time.monotonic()
        done = remote.cli(*command)
        assert time.monotonic() - started < 10
        assert done.returncode == 1 and "connection refused" in done.stderr, done.stderr
    assert not (remote.root / "remote-down").exists()
    # A listing still shows the runs it can reach; a run on an unreachable login node is UNKNOWN, with why.
    record_dir = remote.laptop / "runs" / "gone" / "7@cluster-login"
    record_dir.mkdir(parents=True)
    (record_dir / "run.json").write_text(
        json.dumps(
            {
                "job_id": "7",
                "name": "gone",
                "scheduler": "ssh",
                "run_dir": "/nowhere/7",
                "recipe": TINY,
                "submitted_at": time.time(),
                "nodes": 1,
                "ranks_per_node": 1,
                "launcher": "torchrun",
                "login": yaml.safe_load(profile.read_text())["login"],
            }
        )
    )
    listing = remote.cli("ls")
    assert listing.returncode == 0 and any(
        line.split()[:3] == ["7", "gone", "UNKNOWN"] for line in listing.stdout.splitlines()
    )
    recent = remote.cli("status")
    assert "7  gone  UNKNOWN  (" in recent.stdout and "connection refused" in recent.stdout
    single = remote.cli("status", "7")
    assert single.returncode == 1 and "connection refused" in single.stderr


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_ssh_agent_keys_are_used(remote: Remote, transport: str) -> None:
    """No identity file at all: the only key is in a real ssh-agent."""
    home = remote.root / f"home-agent-{transport}"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(remote.home / ".ssh" / "known_hosts", home / ".ssh" / "known_hosts")
    agent_key = keygen(remote.root / f"agent-key-{transport}")
    with open(remote.root / "authorized_keys", "a") as authorized:
        authorized.write(Path(f"{agent_key}.pub").read_text())
    socket_path = remote.root / f"agent-{transport}.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {**remote.env(home, passphrase=None), "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(["ssh-add", str(agent_key)], env=env, check=True, capture_output=True)
        profile = remote.profile(
            f"agent-{transport}", "remote-agent", port=remote.login.port, user="root", transport=transport
        )
        profile.write_text(profile.read_text().replace("host: cluster-login", "host: 127.0.0.1"))
        done = remote.cli("ls", "--cluster", str(profile), env=env)
        assert done.returncode == 0, done.stderr
        stop_masters(home)
        without_agent = remote.cli("ls", "--cluster", str(profile), env=remote.env(home, passphrase=None))
        assert without_agent.returncode == 1 and "authentication failed" in without_agent.stderr
        if transport == "paramiko":
            assert "no key (no ssh-agent keys, no identity file found)" in without_agent.stderr
    finally:
        agent.terminate()
        agent.wait(timeout=10)

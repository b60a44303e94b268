"""Both SSH transports (the system ssh with a master connection, and paramiko) against real OpenSSH
servers on this machine, without SLURM: a login node and a ProxyJump bastion, key-only. The client has
an account of its own (nss_wrapper, so that ssh's ``~`` is its home): an encrypted key, a ~/.ssh/config
with an ``Include``d alias, a ``ProxyCommand`` host behind a HostKeyAlias, and known_hosts."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from sshd import SSHServer, client_env, client_home, forget_client, masters, runtime_dir, stop_masters

PASSPHRASE = "c0rrect h0rse; $(battery) staple"
TRANSPORTS = ("openssh", "paramiko")
HOSTILE_TEXT = "héllo\n$(touch pwned) `touch pwned2`\n"


@dataclass
class Client:
    root: Path
    home: Path
    login: SSHServer
    jump: SSHServer
    outputs: list[str] = field(default_factory=list)

    def env(self, home: Path | None = None, passphrase: str | None = PASSPHRASE) -> dict[str, str]:
        return client_env(home or self.home, passphrase)

    def profile(self, name: str, host: str = "cluster-login", **login: object) -> Path:
        data = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
        data.update(
            name=name,
            login={"host": host, "remote_workdir": str(self.root / f"work-{name}"), "python": sys.executable, **login},
        )
        path = self.root / "profiles" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data))
        return path

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, cwd=self.root, env=env or self.env(), timeout=120)
        self.outputs.append(done.stdout + done.stderr)
        return done

    def session(
        self, profile: Path, *flags: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, str(REPO / "tests" / "scripts" / "ssh_session.py"), str(profile), *flags],
            cwd=self.root,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.outputs.append(done.stdout + done.stderr)
        return done


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    root = tmp_path_factory.mktemp("transports")
    home, public_key = client_home(root / "home", PASSPHRASE)
    authorized = root / "authorized_keys"
    shutil.copy(public_key, authorized)
    login = SSHServer(root / "sshd-login", authorized).start()
    jump = SSHServer(root / "sshd-jump", authorized).start()
    (home / ".ssh" / "known_hosts").write_text(login.known_hosts_line + jump.known_hosts_line)
    relay = REPO / "tests" / "scripts" / "tcp_relay.py"
    (home / ".ssh" / "config").write_text(
        "Include config.d/*.conf\n\n"
        f"Host cluster-login\n  HostName 127.0.0.1\n  Port {login.port}\n  User root\n  IdentityFile ~/.ssh/id_ed25519\n\n"
        # Its HostName does not resolve: only the ProxyCommand reaches it (and leaves a marker).
        f"Host via-command\n  HostName unreachable.invalid\n  Port {login.port}\n  User root\n"
        f"  HostKeyAlias [127.0.0.1]:{login.port}\n"
        f"  ProxyCommand {sys.executable} {relay} 127.0.0.1 %p {root}/proxied-%n\n\n"
        f"Host bound-login\n  HostName 127.0.0.1\n  Port {login.port}\n  User root\n  BindAddress 127.0.0.1\n"
    )
    (home / ".ssh" / "config.d").mkdir()
    (home / ".ssh" / "config.d" / "cluster.conf").write_text(
        f"Host included-login\n  HostName 127.0.0.1\n  Port {login.port}\n  User root\n"
    )
    made = Client(root, home, login, jump)
    try:
        yield made
    finally:
        homes = [home, *root.glob("home-*")]
        for path in homes:
            stop_masters(path)  # the passphrase checks below read the socket directories too
        login.stop()
        jump.stop()
        for output in made.outputs:
            assert PASSPHRASE not in output
        for path in [*root.rglob("*"), *runtime_dir(home).rglob("*")]:
            if path.is_file() and not path.is_symlink():
                assert PASSPHRASE.encode() not in path.read_bytes(), path
        for path in homes:
            forget_client(path)


def _sign_ins(client: Client, profile: Path, commands: int) -> int:
    """How many times ``commands`` runs of ``clusterkit ls --cluster PROFILE`` signed in, as the login
    node's sshd logs it."""
    before = client.login.log.read_text().count("Accepted publickey for ")
    for _ in range(commands):
        done = client.cli("ls", "--cluster", str(profile))
        assert done.returncode == 0, done.stderr
    return client.login.log.read_text().count("Accepted publickey for ") - before


def _one_line_error(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_commands_and_files_with_hostile_names(client: Client, transport: str) -> None:
    profile = client.profile(f"files-{transport}", transport=transport, identity_file="~/.ssh/id_ed25519")
    done = client.session(profile)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    workdir = client.root / f"work-files-{transport}"
    assert result["workdir"] == str(workdir) and result["name"] == "127.0.0.1"
    assert result["read"] == HOSTILE_TEXT * 2 and (workdir / "renamed.txt").read_text() == HOSTILE_TEXT * 2
    assert stat.S_IMODE((workdir / "renamed.txt").stat().st_mode) == 0o600
    assert result["binary"] and (workdir / "up" / "binary").read_bytes() == bytes(range(256)) * 3
    assert result["listing"] == ["dir with space", "into", "renamed.txt", "up"]  # the hostile directory is empty now
    code = workdir / "up" / "code with space"  # a code snapshot, unpacked by the login node's tar: modes and links kept
    assert (code / "-x ~%" / "run me.py").read_text() == "print('snapshot')\n"
    assert stat.S_IMODE((code / "-x ~%" / "run me.py").stat().st_mode) == 0o750
    assert os.readlink(code / "link") == "-x ~%/run me.py"
    assert result["words"] == "a b|$HOME|';rm -rf .;'|-n|line\nbreak|%C|"
    assert result["exit"] == 7 and result["onto_directory"] == "SSHError" and result["missing"] == "FileNotFoundError"
    assert (workdir / "into").is_dir() and not list(workdir.rglob("*.tmp"))
    assert not list(client.root.rglob("pwned*"))


def test_openssh_signs_in_once_for_several_commands(client: Client) -> None:
    """Three clusterkit commands, one sign-in (the sshd log is the proof); a master killed with -9
    leaves a stale socket, and the next command signs in anew through it."""
    stop_masters(client.home)
    profile = client.profile("once", transport="openssh")
    assert _sign_ins(client, profile, 3) == 1
    [control] = masters(client.home)
    assert stat.S_IMODE(control.parent.stat().st_mode) == 0o700 and len(os.fsencode(control)) < 90

    check = subprocess.run(
        ["ssh", "-o", f"ControlPath={control}", "-O", "check", "--", "master"],
        capture_output=True,
        text=True,
        env=client.env(),
        timeout=10,
    )
    pid = int(re.search(r"pid=(\d+)", check.stderr).group(1))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.is_socket()  # stale
    assert _sign_ins(client, profile, 2) == 1


def _on_a_terminal(client: Client, env: dict[str, str], *args: str, answer: str) -> tuple[int, str, int]:
    """The CLI on a pseudo-terminal of its own, as a user at a terminal runs it: each passphrase prompt
    ssh writes there is answered with ``answer``. Returns (exit status, what the terminal showed, prompts)."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the terminal is its controlling tty and its stdin, stdout and stderr
        os.chdir(client.root)
        os.execve(sys.executable, [sys.executable, "-m", "clusterkit.cli.main", *args], env)
    shown, prompts, deadline = b"", 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        if not select.select([terminal], [], [], 1)[0]:
            continue
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: the child is gone
            break
        if not chunk:
            break
        shown += chunk
        if shown.count(b"Enter passphrase for key") > prompts:
            prompts += 1
            os.write(terminal, answer.encode() + b"\n")
    os.close(terminal)
    status = os.waitpid(pid, 0)[1]
    text = shown.decode("utf-8", "replace")
    client.outputs.append(text)
    return os.waitstatus_to_exitcode(status), text, prompts


def test_a_terminal_user_answers_once_per_session(client: Client) -> None:
    """At a terminal (no $CLUSTERKIT_SSH_PASSPHRASE, no agent) ssh asks; the first clusterkit command
    asks once, the next ones ask nothing: they go through the master connection. A second factor
    is asked the same way, on the same terminal, by the same ssh."""
    stop_masters(client.home)
    profile = client.profile("terminal", transport="openssh")
    env = client.env(passphrase=None)
    before = client.login.log.read_text().count("Accepted publickey for ")
    code, shown, prompts = _on_a_terminal(client, env, "ls", "--cluster", str(profile), answer=PASSPHRASE)
    assert code == 0 and prompts == 1, shown
    for _ in range(2):
        code, shown, prompts = _on_a_terminal(client, env, "ls", "--cluster", str(profile), answer="never asked")
        assert code == 0 and prompts == 0, shown
    assert client.login.log.read_text().count("Accepted publickey for ") - before == 1


@pytest.mark.parametrize("transport, persist", [("paramiko", "10m"), ("openssh", "no")])
def test_without_a_master_each_command_signs_in(client: Client, transport: str, persist: str) -> None:
    stop_masters(client.home)
    profile = client.profile(f"each-{transport}", transport=transport, control_persist=persist)
    # paramiko: one connection per clusterkit command; ssh without a master: one per remote command.
    assert _sign_ins(client, profile, 2) == 2 if transport == "paramiko" else _sign_ins(client, profile, 2) > 2
    assert not masters(client.home)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_proxy_jump_through_a_bastion(client: Client, transport: str) -> None:
    stop_masters(client.home)  # a master to the login node itself would be used instead
    target = f"target 127.0.0.1 port {client.login.port}"
    before = client.jump.log.read_text().count(target)
    profile = client.profile(f"jump-{transport}", transport=transport, proxy_jump=f"root@127.0.0.1:{client.jump.port}")
    done = client.session(profile)
    assert done.returncode == 0, done.stderr
    assert client.jump.log.read_text().count(target) > before


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_included_alias_and_proxy_command_host(client: Client, transport: str) -> None:
    stop_masters(client.home)
    included = client.session(client.profile(f"included-{transport}", host="included-login", transport=transport))
    assert included.returncode == 0, included.stderr
    assert json.loads(included.stdout)["name"] == "127.0.0.1"
    marker = client.root / "proxied-via-command"
    marker.unlink(missing_ok=True)
    stop_masters(client.home)
    proxied = client.session(client.profile(f"proxied-{transport}", host="via-command", transport=transport))
    assert proxied.returncode == 0, proxied.stderr
    assert marker.exists()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_host_keys_unknown_accepted_hashed_and_changed(client: Client, transport: str) -> None:
    home, _ = client_home(client.root / f"home-keys-{transport}", PASSPHRASE)
    shutil.copytree(client.home / ".ssh", home / ".ssh", dirs_exist_ok=True)
    known_hosts = home / ".ssh" / "known_hosts"
    known_hosts.unlink()
    env = client.env(home)
    profile = client.profile(f"keys-{transport}", transport=transport)
    name = f"[127.0.0.1]:{client.login.port}"

    refused = _one_line_error(client.cli("ls", "--cluster", str(profile), env=env))
    assert f"{name} is not in {known_hosts}" in refused and "SHA256:" in refused and "--accept-new-host-key" in refused
    assert not (client.root / f"work-keys-{transport}").exists()

    accepted = client.cli("ls", "--cluster", str(profile), "--accept-new-host-key", env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert client.login.known_hosts_line.split()[2] in known_hosts.read_text()
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True, env=env)
    assert name not in known_hosts.read_text()  # hashed entries only
    stop_masters(home)
    assert client.cli("ls", "--cluster", str(profile), env=env).returncode == 0

    # A changed key (the bastion's, recorded for the login node) is refused, even with the flag.
    _, key_type, key = client.jump.known_hosts_line.split()
    known_hosts.write_text(f"{name} {key_type} {key}\n")
    stop_masters(home)
    changed = _one_line_error(client.cli("ls", "--cluster", str(profile), "--accept-new-host-key", env=env))
    assert "has CHANGED" in changed and f"ssh-keygen -R '{name}' -f {known_hosts}" in changed


@pytest.mark.parametrize(
    "field_name, value",
    [
        ("host", "-oProxyCommand=touch {marker}"),
        ("host", "login\nProxyCommand touch {marker}"),
        ("host", "login node"),
        ("user", "-oProxyCommand=touch {marker}"),
        ("proxy_jump", "-oProxyCommand=touch {marker}"),
        ("proxy_jump", "127.0.0.1,-oProxyCommand=touch {marker}"),
    ],
)
def test_hostile_login_fields_never_reach_ssh(client: Client, field_name: str, value: str) -> None:
    marker = client.root / "injected"
    profile = client.profile("hostile", **{field_name: value.format(marker=marker)})
    message = _one_line_error(client.cli("ls", "--cluster", str(profile)), code=2)
    assert f"login.{field_name}" in message
    assert not marker.exists()


def test_paramiko_refuses_what_it_cannot_honour(client: Client) -> None:
    refused = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("bound-p", host="bound-login", transport="paramiko")))
    )
    assert "`bindaddress 127.0.0.1` is not supported by the paramiko transport" in refused
    stop_masters(client.home)
    honoured = client.cli("ls", "--cluster", str(client.profile("bound-o", host="bound-login", transport="openssh")))
    assert honoured.returncode == 0, honoured.stderr


def test_without_ssh_include_is_refused_not_ignored(client: Client, tmp_path: Path) -> None:
    env = {**client.env(), "PATH": str(tmp_path)}  # no ssh on PATH: auto is paramiko
    refused = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("no-ssh", host="included-login")), env=env)
    )
    assert f"{client.home / '.ssh' / 'config'}:1: Include is not supported without OpenSSH" in refused
    needs = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("no-ssh-o", transport="openssh")), env=env)
    )
    assert "needs OpenSSH's ssh client on PATH" in needs

    # Without Include, paramiko reads the config itself: the alias resolves, BindAddress is refused.
    home, _ = client_home(client.root / "home-no-include", PASSPHRASE)
    shutil.copytree(client.home / ".ssh", home / ".ssh", dirs_exist_ok=True)
    config = home / ".ssh" / "config"
    config.write_text(config.read_text().replace("Include config.d/*.conf\n", ""))
    env = {**client.env(home), "PATH": str(tmp_path)}
    done = client.session(client.profile("no-ssh-alias"), env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "127.0.0.1"
    refused = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("no-ssh-bound", host="bound-login")), env=env)
    )
    assert "`bindaddress 127.0.0.1` is not supported by the paramiko transport" in refused


def test_a_control_directory_others_can_enter_is_refused(client: Client) -> None:
    home, _ = client_home(client.root / "home-shared", PASSPHRASE)
    shutil.copytree(client.home / ".ssh", home / ".ssh", dirs_exist_ok=True)
    env = client.env(home)
    shared = runtime_dir(home) / "clusterkit-ssh"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    refused = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("shared", transport="openssh")), env=env)
    )
    assert f"{shared} is not a private directory of yours" in refused
    assert not masters(home)


def test_paramiko_not_installed_is_one_line_saying_what_to_install(client: Client, tmp_path: Path) -> None:
    (tmp_path / "paramiko.py").write_text("raise ImportError('not installed')\n")
    env = client.env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    refused = _one_line_error(
        client.cli("ls", "--cluster", str(client.profile("no-paramiko", transport="paramiko")), env=env)
    )
    assert "pip install 'clusterkit[ssh]'" in refused
    stop_masters(client.home)
    assert client.cli("ls", "--cluster", str(client.profile("no-paramiko-o")), env=env).returncode == 0  # auto: openssh

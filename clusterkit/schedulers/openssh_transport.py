"""The openssh transport: the system ``ssh``, one master connection per login node.

Every command is ``ssh -o ControlMaster=auto -o ControlPath=DIR/%C -o ControlPersist=TIME ... -- HOST
LINE``, so the user's ssh configuration applies whole, as it does for ``ssh HOST``. The first command
signs in (ssh-agent, keys, a second factor asked on the terminal) and leaves a master connection in the
background; every later one, in this clusterkit command or the next within ``login.control_persist``,
goes through it without signing in again. ``%C`` (a hash of local host, host, port and user) keeps
masters of different hosts and users apart; the directory is private (0700, ours) and short, as a
socket path holds about 104 bytes. A master killed without cleaning up leaves a stale socket, which ssh
itself removes and replaces. A master outlives changes to known_hosts: its host key was checked when
it signed in (``ssh -O exit HOST`` with the same ControlPath, or ``control_persist: no``, ends that).

Host keys: ``StrictHostKeyChecking=yes``, or ``accept-new`` for ``--accept-new-host-key``; ssh's own
many-line warnings become one line. Without a terminal ``BatchMode`` keeps ssh from waiting for an
answer; $CLUSTERKIT_SSH_PASSPHRASE, where set, unlocks an encrypted key through SSH_ASKPASS (a script
that prints the variable: the passphrase itself is never written), with password and keyboard-interactive
sign-in off so that it can never be sent to the server as a password.
"""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

from clusterkit.errors import SSHError
from clusterkit.schedulers.host import Completed, attached
from clusterkit.schedulers.ssh_config import endpoint, ssh_program, ssh_settings
from clusterkit.schedulers.ssh_transport import (
    CONNECT_TIMEOUT_S,
    KEEPALIVE_S,
    PASSPHRASE_ENV,
    AuthenticationFailed,
    Session,
    Unreachable,
    changed_host_key,
    unknown_host_key,
)
from clusterkit.spec.profile import Login, control_persist_option

CONTROL_DIR = "clusterkit-ssh"
# sun_path is 104 bytes on macOS (108 on Linux); ssh binds DIR/%C (40 hex digits) plus a 17-byte suffix.
SOCKET_PATH_MAX = 104
SOCKET_NAME_LENGTH = 1 + 40 + 17
ASKPASS = f'#!/bin/sh\nexec printf "%s\\n" "${PASSPHRASE_ENV}"\n'
# ssh's exit status for its own failures (a remote command may exit 255 too: the message tells them apart).
SSH_FAILED = 255
SSH_FAILURES = re.compile(
    r"^(ssh: |ssh_exchange_identification|kex_exchange_identification|Connection (closed|reset)|"
    r"mux_client|Control socket|ControlSocket|Host key verification failed|.*Permission denied \(|"
    r"Received disconnect|Bad (owner|permissions)|.*: No such file or directory$|"
    r"Load key|.*line \d+: )",
    re.MULTILINE,
)


def control_dir() -> Path:
    """$XDG_RUNTIME_DIR/clusterkit-ssh (the login session's own tmpfs), else /tmp/clusterkit-ssh-UID;
    refused unless it is a directory of ours that no one else may enter (another user could have
    made it first, to catch the sockets)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(runtime) / CONTROL_DIR if runtime else Path("/tmp") / f"{CONTROL_DIR}-{os.getuid()}"
    if len(os.fsencode(path)) + SOCKET_NAME_LENGTH > SOCKET_PATH_MAX:
        raise SSHError(f"{path} is too long for ssh's control sockets; point XDG_RUNTIME_DIR at a shorter directory")
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SSHError(f"cannot make {path} for ssh's control sockets: {exc.strerror} (XDG_RUNTIME_DIR?)") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SSHError(f"{path} is not a private directory of yours (mode 0700): remove it and run again")
    return path


def _askpass(directory: Path) -> Path:
    script = directory / "askpass"
    if not script.is_file() or script.read_text() != ASKPASS:
        staging = directory / "askpass.tmp"
        staging.write_text(ASKPASS)
        staging.chmod(0o700)
        staging.replace(script)
    return script


def ssh_argv(login: Login, accept_new: bool, interactive: bool, directory: Path) -> list[str]:
    """``ssh`` and its options, up to (not including) ``-- HOST``."""
    options = {
        "StrictHostKeyChecking": "accept-new" if accept_new else "yes",
        "ConnectTimeout": f"{CONNECT_TIMEOUT_S:.0f}",
        "ServerAliveInterval": str(KEEPALIVE_S),
    }
    persist = control_persist_option(login.control_persist)
    if persist == "no":
        options |= {"ControlMaster": "no", "ControlPath": "none"}
    else:
        options |= {"ControlMaster": "auto", "ControlPath": f"{directory}/%C", "ControlPersist": persist}
    if not interactive:
        if PASSPHRASE_ENV in os.environ:
            options |= {
                "PasswordAuthentication": "no",
                "KbdInteractiveAuthentication": "no",
                "NumberOfPasswordPrompts": "1",
            }
        else:
            options["BatchMode"] = "yes"
    argv = [ssh_program() or "ssh", "-T"]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    if login.port:
        argv += ["-p", str(login.port)]
    if login.user:
        argv += ["-l", login.user]
    if login.identity_file:
        argv += ["-i", login.identity_file]
    if login.proxy_jump:
        argv += ["-J", login.proxy_jump]
    return argv


def _fileno(sink: BinaryIO | None) -> int | None:
    if sink is None:
        return None
    try:
        sink.flush()
        return sink.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


class OpenSSHSession(Session):
    """Commands on the login node through the system ``ssh`` and its master connection."""

    def __init__(self, login: Login, accept_new: bool):
        self.login, self.accept_new = login, accept_new
        if ssh_program() is None:
            raise SSHError(
                "login.transport openssh needs OpenSSH's ssh client on PATH "
                "(or login.transport: paramiko, with pip install 'clusterkit[ssh]')"
            )
        settings = ssh_settings(login.host, login.port, login.user, login.identity_file, login.proxy_jump)
        self.endpoint, _ = endpoint(login.host, settings, login.identity_file is not None)
        directory = control_dir()
        interactive = sys.stdin.isatty()
        self.argv = ssh_argv(login, accept_new, interactive, directory)
        self.env = dict(os.environ)
        if not interactive and PASSPHRASE_ENV in os.environ:
            self.env |= {"SSH_ASKPASS": str(_askpass(directory)), "SSH_ASKPASS_REQUIRE": "force"}

    def run(
        self,
        command: str,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> Completed:
        out_fd, err_fd = _fileno(stdout), _fileno(stderr)
        try:
            with subprocess.Popen(
                [*self.argv, "--", self.login.host, command],
                env=self.env,
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE if out_fd is None else out_fd,
                stderr=subprocess.PIPE if err_fd is None else err_fd,
            ) as process:
                try:
                    out, err = process.communicate(stdin, timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()
                    raise SSHError(f"{self.endpoint}: `{command}` gave no result within {timeout:.0f} s") from None
        except FileNotFoundError:
            raise SSHError(f"{self.argv[0]}: command not found") from None
        for sink, data in ((stdout, out), (stderr, err)):
            if sink is not None and data:  # a sink without a file descriptor gets the output at the end
                sink.write(data)
                sink.flush()
        message = (err or b"").decode("utf-8", "replace")
        if process.returncode == SSH_FAILED and SSH_FAILURES.search(message):
            raise self._failure(message)
        return Completed(process.returncode, (out or b"").decode("utf-8", "replace"), message)

    def attach(self, command: str, tty: bool = False) -> int:
        # ssh -t instead of -T: a terminal there for the command, this one's input and output passed
        # through; without -t, this terminal's input and output are the command's as they are.
        argv = [*self.argv, "--", self.login.host, command]
        if tty:
            argv[argv.index("-T")] = "-t"
        return attached(argv, env=self.env)

    def _failure(self, message: str) -> SSHError:
        """ssh's own error as one line."""
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        known_hosts = self.endpoint.known_hosts[0]
        changed = re.search(r"Host key for (\S+) has changed", message)
        if changed or "REMOTE HOST IDENTIFICATION HAS CHANGED" in message:
            offending = re.search(r"Offending \S+ key in (\S+):\d+", message)
            key = re.search(r"fingerprint for the (\S+) key sent by the remote host is\s+(SHA256:\S+)", message)
            return changed_host_key(
                changed.group(1) if changed else self.endpoint.known_hosts_name,
                offending.group(1) if offending else known_hosts,
                f"{key.group(1)} {key.group(2)}" if key else None,
            )
        unknown = re.search(r"host key is known for (\S+) and you have requested strict checking", message)
        if unknown:
            return unknown_host_key(unknown.group(1), known_hosts, self._offered_key())
        if "Permission denied" in message:
            return AuthenticationFailed(
                f"{self.endpoint}: authentication failed ({lines[-1]}). Check login.user and login.identity_file "
                f"(or ~/.ssh/config); an encrypted key needs ssh-agent (ssh-add), a terminal or {PASSPHRASE_ENV}"
            )
        if "Connection refused" in message:
            return Unreachable(f"{self.endpoint}: connection refused (is sshd running there, and is the port right?)")
        if "Could not resolve hostname" in message:
            return SSHError(f"cannot resolve host {self.endpoint.host} (login.host, or HostName in ~/.ssh/config)")
        if "timed out" in message:
            return Unreachable(f"{self.endpoint}: no answer within {CONNECT_TIMEOUT_S:.0f} s")
        return Unreachable(f"{self.endpoint}: ssh failed: {lines[-1] if lines else 'no message'}")

    def _offered_key(self) -> str | None:
        """The fingerprint of the key the host offers, as ssh logs it (a second, throwaway connection
        that stops at the host key check)."""
        argv = list(self.argv)  # ssh takes an option's first value: these win over the session's
        argv[1:1] = [
            "-o",
            "LogLevel=DEBUG1",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
        ]
        try:
            done = subprocess.run(
                [*argv, "--", self.login.host, "true"],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=2 * CONNECT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        found = re.findall(r"Server host key: (\S+ SHA256:\S+)", done.stderr)
        return found[-1] if found else None


def connect(login: Login, accept_new_host_key: bool = False) -> OpenSSHSession:
    """Sign in (or reuse the master connection): a first command, so that a wrong host key, key or
    port is reported before anything is sent."""
    session = OpenSSHSession(login, accept_new_host_key)
    done = session.run("true", timeout=4 * CONNECT_TIMEOUT_S)
    for line in done.stderr.splitlines():
        if line.startswith("Warning: Permanently added"):  # --accept-new-host-key wrote known_hosts
            print(f"clusterkit: {line.removeprefix('Warning: ').strip()}", file=sys.stderr)
    if done.returncode != 0:
        raise SSHError(
            f"on {session.endpoint.host}: `true` failed ({done.returncode}): the login shell "
            f"prints errors or exits: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    return session

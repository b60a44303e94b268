"""The paramiko transport: SSH without the system ``ssh`` (``pip install clusterkit[ssh]``).

Settings come from :mod:`.ssh_config` (``ssh -G`` where ``ssh`` exists): HostName, User, Port,
IdentityFile, CertificateFile, IdentitiesOnly, ProxyJump, ProxyCommand, HostKeyAlias and the known_hosts
files are honoured, what paramiko cannot honour is refused by name. ssh-agent keys are offered first
(unless IdentitiesOnly), then the identity files; host keys are checked against known_hosts (hashed
entries too). One :class:`ParamikoSession` (one connection, through any jump hosts) serves a whole
clusterkit command: each command signs in anew (the openssh transport keeps a master connection).
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from clusterkit.errors import SSHError
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.ssh_config import Endpoint, home_path, resolve
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
from clusterkit.spec.profile import Login

try:
    import paramiko
except ImportError:  # an optional extra: a one-line message, from connect(), says what to install
    paramiko = None  # type: ignore[assignment]

# What paramiko's SSHConfig would ignore or half-apply, so a host would resolve differently than with ssh.
UNRESOLVABLE = re.compile(r"^\s*(include|match)\b", re.IGNORECASE)


def _require_paramiko() -> None:
    if paramiko is None:
        raise SSHError(
            "login.transport paramiko needs paramiko: pip install 'clusterkit[ssh]' "
            "(or install OpenSSH's ssh client and use login.transport: openssh)"
        )


def paramiko_config() -> Any:
    """~/.ssh/config for paramiko, where no ``ssh -G`` can resolve it."""
    _require_paramiko()
    path = home_path("~/.ssh/config")
    if not path.is_file():
        return paramiko.SSHConfig()
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if UNRESOLVABLE.match(line):
            raise SSHError(
                f"{path}:{number}: {line.split()[0]} is not supported without OpenSSH's ssh (paramiko would "
                f"ignore it and reach another host): install the ssh client, or remove it"
            )
    return paramiko.SSHConfig.from_path(str(path))


def fingerprint(key: Any) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _KnownHosts:
    """known_hosts as OpenSSH reads it: the user's files (the first one written on
    --accept-new-host-key) and the system-wide ones."""

    def __init__(self, endpoint: Endpoint):
        self.path = home_path(endpoint.known_hosts[0])
        self.keys = paramiko.HostKeys()
        for text in (*endpoint.system_known_hosts, *endpoint.known_hosts):
            path = home_path(text)
            if path.is_file():
                self.keys.load(str(path))

    def known_types(self, name: str) -> list[str]:
        return list(self.keys.lookup(name) or {})

    def check(self, name: str, key: Any, accept_new: bool) -> None:
        known = self.keys.lookup(name) or {}
        if key.get_name() in known:
            if known[key.get_name()] == key:
                return
            raise changed_host_key(name, str(self.path), fingerprint(key))
        if not accept_new:
            raise unknown_host_key(name, str(self.path), fingerprint(key))
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Appended, not rewritten: the user's comments and hashed entries stay as they are.
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        self.path.chmod(0o600)
        self.keys.add(name, key.get_name(), key)
        print(f"clusterkit: added {name} ({fingerprint(key)}) to {self.path}", file=sys.stderr)


def _load_identity(path_text: str, named: bool, certificates: tuple[str, ...]) -> Any:
    path = home_path(path_text)
    if not path.is_file():
        if named:
            raise AuthenticationFailed(f"identity file {path} does not exist (login.identity_file or IdentityFile)")
        return None
    try:
        key = paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "password-protected"
        key = _decrypt(path)
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise AuthenticationFailed(f"identity file {path} is not a private key clusterkit can read: {exc}") from None
    # A certificate signed for this key (CertificateFile, or ssh's default KEY-cert.pub) is offered with it.
    for certificate in (*certificates, f"{path}-cert.pub"):
        if home_path(certificate).is_file():
            try:
                key.load_certificate(str(home_path(certificate)))
                break
            except ValueError:  # a certificate for another key
                continue
    return key


def _decrypt(path: Path) -> Any:
    secret = os.environ.get(PASSPHRASE_ENV)
    if secret is None and sys.stdin.isatty():
        secret = getpass.getpass(f"passphrase for {path}: ")
    if secret is None:
        raise AuthenticationFailed(
            f"identity file {path} is encrypted: add it to ssh-agent (ssh-add {path}), or set {PASSPHRASE_ENV}"
        )
    try:
        return paramiko.PKey.from_path(path, password=secret.encode())
    except (paramiko.SSHException, ValueError, TypeError):
        raise AuthenticationFailed(f"identity file {path}: wrong passphrase") from None


def _authenticate(transport: Any, endpoint: Endpoint) -> None:
    offered = []
    agent = paramiko.Agent()
    try:
        agent_keys = [] if endpoint.identities_only else agent.get_keys()
        candidates: list[tuple[str, Callable[[], Any]]] = [
            (f"ssh-agent key {fingerprint(key)}", lambda key=key: key) for key in agent_keys
        ]
        candidates += [
            (path, lambda path=path: _load_identity(path, endpoint.identity_named, endpoint.certificate_files))
            for path in endpoint.identity_files
        ]
        for label, load in candidates:
            key = load()
            if key is None:
                continue
            offered.append(label)
            try:
                remaining = transport.auth_publickey(endpoint.user, key)
            except paramiko.BadAuthenticationType as exc:
                raise AuthenticationFailed(
                    f"{endpoint}: the server accepts only {', '.join(exc.allowed_types)}; clusterkit "
                    f"signs in with keys (ssh-agent or login.identity_file)"
                ) from None
            except paramiko.AuthenticationException:
                continue
            if remaining and sys.stdin.isatty():  # a second factor (e.g. a one-time code)
                transport.auth_interactive_dumb(endpoint.user)
            if transport.is_authenticated():
                return
    finally:
        agent.close()
    tried = "; ".join(offered) or "no key (no ssh-agent keys, no identity file found)"
    raise AuthenticationFailed(
        f"{endpoint}: authentication failed, the server refused {tried}. Check login.user and "
        f"login.identity_file in the cluster profile (or ~/.ssh/config), or add the key to ssh-agent"
    )


def _open_socket(endpoint: Endpoint) -> Any:
    if endpoint.proxy_command:
        try:
            # Through the user's shell, as ssh runs it (paramiko alone would split it into words).
            shell = os.environ.get("SHELL") or "/bin/sh"
            return paramiko.ProxyCommand(shlex.join([shell, "-c", f"exec {endpoint.proxy_command}"]))
        except paramiko.SSHException as exc:
            raise Unreachable(f"{endpoint}: ProxyCommand failed: {exc}") from None
    try:
        return socket.create_connection((endpoint.host, endpoint.port), timeout=CONNECT_TIMEOUT_S)
    except socket.gaierror:
        raise SSHError(f"cannot resolve host {endpoint.host} (login.host, or HostName in ~/.ssh/config)") from None
    except TimeoutError:
        raise Unreachable(f"{endpoint}: no answer within {CONNECT_TIMEOUT_S:.0f} s") from None
    except ConnectionRefusedError:
        raise Unreachable(f"{endpoint}: connection refused (is sshd running there, and is the port right?)") from None
    except OSError as exc:
        raise Unreachable(f"{endpoint}: {exc.strerror or exc}") from None


def _start_transport(sock: Any, endpoint: Endpoint, accept_new: bool) -> Any:
    known = _KnownHosts(endpoint)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = CONNECT_TIMEOUT_S
    preferred = known.known_types(endpoint.known_hosts_name)
    if preferred:  # ask for the key type we already trust, as OpenSSH does
        options = transport.get_security_options()
        options.key_types = tuple(preferred) + tuple(t for t in options.key_types if t not in preferred)
    try:
        transport.start_client(timeout=CONNECT_TIMEOUT_S)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        transport.close()
        raise Unreachable(f"{endpoint}: the SSH handshake failed ({exc or type(exc).__name__})") from None
    try:
        known.check(endpoint.known_hosts_name, transport.get_remote_server_key(), accept_new)
        _authenticate(transport, endpoint)
    except BaseException:
        transport.close()
        raise
    transport.set_keepalive(KEEPALIVE_S)
    return transport


class ParamikoSession(Session):
    """One authenticated connection to the login node (through its jump hosts)."""

    def __init__(self, endpoint: Endpoint, transports: list[Any]):
        self.endpoint = endpoint
        self._transports = transports

    def run(
        self,
        command: str,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> Completed:
        try:
            channel = self._transports[-1].open_session(timeout=CONNECT_TIMEOUT_S)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise Unreachable(f"{self.endpoint}: the connection was lost ({exc or type(exc).__name__})") from None
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()  # end of input: a reading command (cat) finishes
            while True:
                idle = True
                for ready, receive, sink, buffer in (
                    (channel.recv_ready, channel.recv, stdout, out),
                    (channel.recv_stderr_ready, channel.recv_stderr, stderr, err),
                ):
                    if ready():
                        idle = False
                        chunk = receive(65536)
                        if sink is not None:
                            sink.write(chunk)
                            sink.flush()
                        else:
                            buffer += chunk
                if (
                    idle
                    and channel.exit_status_ready()
                    and not channel.recv_ready()
                    and not channel.recv_stderr_ready()
                ):
                    break
                if time.monotonic() > deadline:
                    raise SSHError(f"{self.endpoint}: `{command}` gave no result within {timeout:.0f} s")
                if idle:
                    time.sleep(0.02)
            return Completed(channel.recv_exit_status(), out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise Unreachable(f"{self.endpoint}: the connection was lost ({exc or type(exc).__name__})") from None
        finally:
            channel.close()

    def close(self) -> None:
        for transport in reversed(self._transports):
            transport.close()


def connect(login: Login, accept_new_host_key: bool = False) -> ParamikoSession:
    """Connect (through each jump host in turn) and authenticate; every step bounded in time."""
    _require_paramiko()
    endpoints = resolve(login, paramiko_config)
    transports: list[Any] = []
    try:
        sock = _open_socket(endpoints[0])
        for index, endpoint in enumerate(endpoints):
            transports.append(_start_transport(sock, endpoint, accept_new_host_key))
            if index + 1 < len(endpoints):
                following = endpoints[index + 1]
                try:
                    sock = transports[-1].open_channel(
                        "direct-tcpip", (following.host, following.port), ("127.0.0.1", 0), timeout=CONNECT_TIMEOUT_S
                    )
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise Unreachable(f"jump host {endpoint} could not reach {following}: {exc}") from None
    except BaseException:
        for transport in reversed(transports):
            transport.close()
        raise
    return ParamikoSession(endpoints[-1], transports)

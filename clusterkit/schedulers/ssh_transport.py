"""SSH to a cluster's login node with paramiko, the way OpenSSH would connect.

~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile) is honoured,
ssh-agent keys are offered first, and host keys are checked against known_hosts: an unknown key is
refused unless the user passes ``--accept-new-host-key`` (OpenSSH's ``accept-new``); a changed key is
always refused. One :class:`SSHSession` (one connection, through any jump hosts) serves a whole
clusterkit command. Passphrases are only ever held in memory: never logged, stored or rendered.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

import paramiko

from clusterkit.errors import SSHError
from clusterkit.schedulers.host import Completed
from clusterkit.spec.profile import Login, expanded

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 15
# For CI and other non-interactive use; on a terminal clusterkit asks, and ssh-agent needs neither.
PASSPHRASE_ENV = "CLUSTERKIT_SSH_PASSPHRASE"
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
READ_ONLY_ATTEMPTS = 3

class Unreachable(SSHError):
    """The host did not answer, refused the connection or dropped it: worth a retry for reads."""


class HostKeyRefused(SSHError):
    pass


class AuthenticationFailed(SSHError):
    pass


@dataclass(frozen=True)
class Endpoint:
    """One SSH server to connect to, after ~/.ssh/config is applied."""

    host: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    # Whether identity_files were named (a missing file is then an error, not skipped).
    identity_named: bool = False
    known_hosts: str = "~/.ssh/known_hosts"

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def _ssh_config() -> paramiko.SSHConfig:
    path = Path("~/.ssh/config").expanduser()
    return paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()


def _endpoint(name: str, config: paramiko.SSHConfig, port: int | None, user: str | None,
              identity: str | None) -> Endpoint:
    entry = config.lookup(name)
    named = [identity] if identity else list(entry.get("identityfile", []))
    known_hosts = (entry.get("userknownhostsfile") or "~/.ssh/known_hosts").split()[0]
    return Endpoint(
        host=entry.get("hostname", name),
        port=port or int(entry.get("port", 22)),
        user=user or entry.get("user") or getpass.getuser(),
        identity_files=tuple(named or DEFAULT_IDENTITIES),
        identity_named=bool(named),
        known_hosts=known_hosts,
    )


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (ssh -J syntax) → (user, host, port)."""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, port_text = hostport.split(":")
        port = int(port_text)
    return user or None, host, port


def resolve(login: Login) -> list[Endpoint]:
    """The servers to go through, jump hosts first, the login node last."""
    config = _ssh_config()
    target = _endpoint(login.host, config, login.port, login.user, login.identity_file)
    jump = login.proxy_jump or config.lookup(login.host).get("proxyjump")
    hops = []
    if jump and jump.lower() != "none":
        for spec in jump.split(","):
            user, host, port = _parse_jump(spec.strip())
            hops.append(_endpoint(host, config, port, user, None))
    return [*hops, target]


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _KnownHosts:
    """known_hosts as OpenSSH reads it: the user's file (written on --accept-new-host-key) and the
    system-wide one."""

    def __init__(self, user_file: str):
        self.path = expanded(user_file)
        self.keys = paramiko.HostKeys()
        for path in (Path(SYSTEM_KNOWN_HOSTS), self.path):
            if path.is_file():
                self.keys.load(str(path))

    def known_types(self, name: str) -> list[str]:
        return list(self.keys.lookup(name) or {})

    def check(self, name: str, key: paramiko.PKey, accept_new: bool) -> None:
        known = self.keys.lookup(name) or {}
        if key.get_name() in known:
            if known[key.get_name()] == key:
                return
            raise HostKeyRefused(
                f"the host key of {name} has CHANGED (it now offers {fingerprint(key)}) and does not match "
                f"{self.path}: someone may be intercepting the connection, or the host was reinstalled. "
                f"Ask your cluster admins; if they confirm the new key, remove the old one with "
                f"`ssh-keygen -R '{name}' -f {self.path}` and connect again")
        if not accept_new:
            raise HostKeyRefused(
                f"{name} is not in {self.path} (it offers {fingerprint(key)}). Check this fingerprint with "
                f"your cluster admins (on the host: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then run "
                f"again with --accept-new-host-key to trust it")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Appended, not rewritten: the user's comments and hashed entries stay as they are.
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        self.path.chmod(0o600)
        self.keys.add(name, key.get_name(), key)
        print(f"clusterkit: added {name} ({fingerprint(key)}) to {self.path}", file=sys.stderr)


def _load_identity(path_text: str, named: bool) -> paramiko.PKey | None:
    path = expanded(path_text)
    if not path.is_file():
        if named:
            raise AuthenticationFailed(f"identity file {path} does not exist (login.identity_file or IdentityFile)")
        return None
    try:
        return paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "password-protected"
        pass
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise AuthenticationFailed(f"identity file {path} is not a private key clusterkit can read: {exc}") from None
    secret = os.environ.get(PASSPHRASE_ENV)
    if secret is None and sys.stdin.isatty():
        secret = getpass.getpass(f"passphrase for {path}: ")
    if secret is None:
        raise AuthenticationFailed(
            f"identity file {path} is encrypted: add it to ssh-agent (ssh-add {path}), or set {PASSPHRASE_ENV}")
    try:
        return paramiko.PKey.from_path(path, password=secret.encode())
    except (paramiko.SSHException, ValueError, TypeError):
        raise AuthenticationFailed(f"identity file {path}: wrong passphrase") from None


def _authenticate(transport: paramiko.Transport, endpoint: Endpoint) -> None:
    offered = []
    agent = paramiko.Agent()
    try:
        candidates: list[tuple[str, Callable[[], paramiko.PKey | None]]] = [
            (f"ssh-agent key {fingerprint(key)}", lambda key=key: key) for key in agent.get_keys()]
        candidates += [(path, lambda path=path: _load_identity(path, endpoint.identity_named))
                       for path in endpoint.identity_files]
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
                    f"signs in with keys (ssh-agent or login.identity_file)") from None
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
        f"login.identity_file in the cluster profile (or ~/.ssh/config), or add the key to ssh-agent")


def _open_socket(endpoint: Endpoint) -> socket.socket:
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


def _start_transport(sock: socket.socket | paramiko.Channel, endpoint: Endpoint, accept_new: bool) -> paramiko.Transport:
    known = _KnownHosts(endpoint.known_hosts)
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


class SSHSession:
    """One authenticated connection to the login node (through its jump hosts)."""

    def __init__(self, endpoint: Endpoint, transports: list[paramiko.Transport]):
        self.endpoint = endpoint
        self._transports = transports
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def transport(self) -> paramiko.Transport:
        return self._transports[-1]

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = paramiko.SFTPClient.from_transport(self.transport)
        return self._sftp

    def run(self, command: str, timeout: float = 120.0, stdout: BinaryIO | None = None,
            stderr: BinaryIO | None = None) -> Completed:
        """Run one shell command line there. With ``stdout``/``stderr`` given, output is passed
        through as it arrives (``logs -f``) instead of being collected."""
        try:
            channel = self.transport.open_session(timeout=CONNECT_TIMEOUT_S)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise Unreachable(f"{self.endpoint}: the connection was lost ({exc or type(exc).__name__})") from None
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            channel.exec_command(command)
            while True:
                idle = True
                for ready, receive, sink, buffer in ((channel.recv_ready, channel.recv, stdout, out),
                                                     (channel.recv_stderr_ready, channel.recv_stderr, stderr, err)):
                    if ready():
                        idle = False
                        chunk = receive(65536)
                        if sink is not None:
                            sink.write(chunk)
                            sink.flush()
                        else:
                            buffer += chunk
                if idle and channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
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

    def check(self, command: str, timeout: float = 120.0) -> str:
        done = self.run(command, timeout)
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise SSHError(f"on {self.endpoint.host}: `{command}` failed ({done.returncode}): "
                           f"{detail[-1] if detail else 'no output'}")
        return done.stdout

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        for transport in reversed(self._transports):
            transport.close()

    def __enter__(self) -> "SSHSession":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect(login: Login, accept_new_host_key: bool = False) -> SSHSession:
    """Connect (through each jump host in turn) and authenticate; every step bounded in time."""
    endpoints = resolve(login)
    transports: list[paramiko.Transport] = []
    try:
        sock: socket.socket | paramiko.Channel = _open_socket(endpoints[0])
        for index, endpoint in enumerate(endpoints):
            transports.append(_start_transport(sock, endpoint, accept_new_host_key))
            if index + 1 < len(endpoints):
                following = endpoints[index + 1]
                try:
                    sock = transports[-1].open_channel("direct-tcpip", (following.host, following.port),
                                                       ("127.0.0.1", 0), timeout=CONNECT_TIMEOUT_S)
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise Unreachable(f"jump host {endpoint} could not reach {following}: {exc}") from None
    except BaseException:
        for transport in reversed(transports):
            transport.close()
        raise
    return SSHSession(endpoints[-1], transports)


def command_line(argv: Sequence[str], cwd: str | None = None) -> str:
    """A remote shell command line: every word quoted, so no value can reach the shell unquoted."""
    line = " ".join(shlex.quote(str(word)) for word in argv)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line

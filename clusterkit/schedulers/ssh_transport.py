"""The connection to a cluster's login node, whichever program makes it.

Two transports offer one :class:`Session` surface (run a quoted command line, with standard input
and with output passed through as it arrives for ``logs -f``):

* ``openssh`` (:mod:`.openssh_transport`): the system ``ssh``, so the user's whole ssh setup applies
  as it does for ``ssh HOST``, and one authenticated master connection (ControlMaster) serves every
  clusterkit command for ``login.control_persist``: a second factor is asked once per session.
* ``paramiko`` (:mod:`.paramiko_transport`, ``pip install clusterkit[ssh]``): for machines without
  ``ssh``; it signs in for each clusterkit command and refuses, by name, the settings it cannot honour.

``login.transport: auto`` takes ``openssh`` where ``ssh`` is on PATH. Both check host keys the same
strict way: an unknown key is refused unless the user passes ``--accept-new-host-key`` (OpenSSH's
``accept-new``), a changed key always is. Passphrases are only ever held in memory.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from collections.abc import Sequence
from typing import BinaryIO

from clusterkit.errors import SSHError, UsageError
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.ssh_config import Endpoint, ssh_program
from clusterkit.spec.profile import Login

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 15
# For CI and other non-interactive use; on a terminal ssh or clusterkit asks, and ssh-agent needs neither.
PASSPHRASE_ENV = "CLUSTERKIT_SSH_PASSPHRASE"
READ_ONLY_ATTEMPTS = 3
TRANSPORTS = {
    "openssh": "clusterkit.schedulers.openssh_transport",
    "paramiko": "clusterkit.schedulers.paramiko_transport",
}


class Unreachable(SSHError):
    """The host did not answer, refused the connection or dropped it: worth a retry for reads."""


class HostKeyRefused(SSHError):
    pass


class AuthenticationFailed(SSHError):
    pass


def unknown_host_key(name: str, known_hosts: str, fingerprint: str | None) -> HostKeyRefused:
    offers = f" (it offers {fingerprint})" if fingerprint else ""
    return HostKeyRefused(
        f"{name} is not in {known_hosts}{offers}. Check its fingerprint with your cluster admins (on the "
        f"host: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then run again with --accept-new-host-key to trust it"
    )


def changed_host_key(name: str, known_hosts: str, fingerprint: str | None) -> HostKeyRefused:
    offers = f" (it now offers {fingerprint})" if fingerprint else ""
    return HostKeyRefused(
        f"the host key of {name} has CHANGED{offers} and does not match {known_hosts}: someone may be "
        f"intercepting the connection, or the host was reinstalled. Ask your cluster admins; if they confirm "
        f"the new key, remove the old one with `ssh-keygen -R '{name}' -f {known_hosts}` and connect again"
    )


# How long a command that runs with the user's terminal (exec, shell) may take: as long as they keep it.
ATTACHED_TIMEOUT_S = 7 * 24 * 3600.0


class Session:
    """One way to run commands on the login node; :meth:`run` is the transport's."""

    endpoint: Endpoint

    def run(
        self,
        command: str,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> Completed:
        """Run one shell command line there, ``stdin`` as its standard input (none: empty). With
        ``stdout``/``stderr`` given, output is passed through as it arrives instead of being collected."""
        raise NotImplementedError

    def attach(self, command: str, tty: bool = False) -> int:
        """Run one shell command line there with this terminal's output (and, where the transport
        can, its input and a terminal of its own), for as long as it runs; its exit status."""
        if tty:
            raise UsageError(
                f"the {type(self).__name__.removesuffix('Session').lower()} SSH transport cannot give a command "
                f"on {self.endpoint.host} a terminal: set login.transport: openssh (the system ssh) for clusterkit shell"
            )
        return self.run(command, ATTACHED_TIMEOUT_S, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer).returncode

    def check(self, command: str, timeout: float = 120.0, stdin: bytes | None = None) -> str:
        done = self.run(command, timeout, stdin)
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise SSHError(
                f"on {self.endpoint.host}: `{command}` failed ({done.returncode}): "
                f"{detail[-1] if detail else 'no output'}"
            )
        return done.stdout

    def close(self) -> None:
        pass

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def transport_name(login: Login) -> str:
    if login.transport != "auto":
        return login.transport
    return "openssh" if ssh_program() else "paramiko"


def connect(login: Login, accept_new_host_key: bool = False) -> Session:
    """A session with the login node over the profile's transport, connected and authenticated."""
    module = importlib.import_module(TRANSPORTS[transport_name(login)])
    return module.connect(login, accept_new_host_key)


def command_line(argv: Sequence[str], cwd: str | None = None) -> str:
    """A remote shell command line: every word quoted, so no value can reach the shell unquoted.
    ``cwd`` is a folder even where it reads as an option (``-P``): after ``--``; and ``-``, which
    ``cd`` takes as the previous folder even then, as ``./-``."""
    line = " ".join(shlex.quote(str(word)) for word in argv)
    if not cwd:
        return line
    return f"cd -- {shlex.quote('./-' if cwd == '-' else cwd)} && {line}"

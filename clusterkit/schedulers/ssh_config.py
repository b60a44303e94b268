"""A login node's SSH settings, resolved the way the user's own ``ssh`` resolves them.

Where ``ssh`` is on PATH, ``ssh -G`` answers: ~/.ssh/config and /etc/ssh/ssh_config whole,
``Include``, ``Match``, ``ProxyCommand``, ``CertificateFile`` and ``HostKeyAlias`` among them, exactly as
``ssh HOST`` would apply them (its ``~`` is the account's home, as ssh's own is). Without ``ssh``,
paramiko's SSHConfig reads ~/.ssh/config; it has no ``Include`` and only part of ``Match``, so a
config using either is refused rather than resolved to a different host.

The paramiko transport then refuses, by name, each setting in force that it cannot honour
(:func:`unsupported`); the openssh transport needs none of this but the host name for messages.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterkit.errors import SSHError
from clusterkit.spec.profile import Login, expanded

RESOLVE_TIMEOUT_S = 10.0
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts",)
SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts",)
# ssh -G's lower-case names of settings paramiko has no way to honour, each with the values that ask
# for nothing (where it prints one even when unset).
UNSUPPORTED = {
    "pkcs11provider": ("none",),
    "bindaddress": (),
    "bindinterface": (),
    "addressfamily": ("any",),
    "proxyusefdpass": ("no",),
    "identityagent": ("SSH_AUTH_SOCK", "none"),
    "securitykeyprovider": ("internal", "$SSH_SK_PROVIDER"),
}
# The ProxyCommand tokens filled in here (%n: the name as given, %r: the user); others are refused.
PROXY_TOKENS = re.compile(r"%(.)")


@dataclass(frozen=True)
class Endpoint:
    """One SSH server to connect to, after the ssh configuration is applied."""

    host: str
    port: int
    user: str
    identity_files: tuple[str, ...] = DEFAULT_IDENTITIES
    # Whether identity_files were named in the profile (a missing file is then an error, not skipped).
    identity_named: bool = False
    known_hosts: tuple[str, ...] = USER_KNOWN_HOSTS
    system_known_hosts: tuple[str, ...] = SYSTEM_KNOWN_HOSTS
    # The name known_hosts knows this server by, when not its host name (HostKeyAlias).
    host_key_alias: str | None = None
    proxy_command: str | None = None
    certificate_files: tuple[str, ...] = ()
    identities_only: bool = False

    @property
    def known_hosts_name(self) -> str:
        if self.host_key_alias:
            return self.host_key_alias
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def ssh_program() -> str | None:
    return shutil.which("ssh")


def home_path(text: str) -> Path:
    """``~/`` as ssh expands it: the account's home directory (not $HOME)."""
    if text.startswith("~/"):
        return Path(pwd.getpwuid(os.getuid()).pw_dir) / text[2:]
    return expanded(text)


def ssh_settings(
    name: str, port: int | None = None, user: str | None = None, identity: str | None = None, jump: str | None = None
) -> dict[str, list[str]]:
    """``ssh -G``: every setting ssh would use for ``name`` (lower-case name → its values)."""
    argv = [
        ssh_program() or "ssh",
        "-G",
        *(["-p", str(port)] if port else []),
        *(["-l", user] if user else []),
        *(["-i", identity] if identity else []),
        *(["-J", jump] if jump else []),
        "--",
        name,
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired:
        raise SSHError(
            f"ssh -G {name} gave no answer within {RESOLVE_TIMEOUT_S:.0f} s (a Match exec in the ssh config?)"
        ) from None
    if done.returncode != 0:
        detail = [line for line in done.stderr.splitlines() if line.strip()]
        raise SSHError(f"ssh -G {name}: {detail[-1] if detail else 'failed'} (check ~/.ssh/config)")
    settings: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key, []).append(value)
    return settings


def unsupported(name: str, settings: dict[str, list[str]]) -> None:
    for key, harmless in UNSUPPORTED.items():
        for value in settings.get(key, []):
            if value not in harmless:
                raise SSHError(
                    f"{name}: the ssh setting `{key} {value}` is not supported by the paramiko "
                    f"transport; use login.transport: openssh, or remove it from the ssh config"
                )


def _proxy_command(name: str, found: Endpoint) -> str:
    """ProxyCommand with its tokens filled in, as ssh fills them (``%n``: the name as given)."""
    values = {"h": found.host, "p": str(found.port), "r": found.user, "n": name, "%": "%"}

    def token(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise SSHError(
                f"{name}: ProxyCommand token %{match.group(1)} is not supported by the paramiko "
                f"transport; use login.transport: openssh"
            )
        return values[match.group(1)]

    return PROXY_TOKENS.sub(token, found.proxy_command or "")


def endpoint(name: str, settings: dict[str, list[str]], identity_named: bool) -> tuple[Endpoint, str | None]:
    """The server ``ssh -G`` settings describe (ProxyCommand as written) and its ProxyJump, if any."""

    def one(key: str) -> str | None:
        return (settings.get(key) or [None])[0]

    proxy_command = one("proxycommand")
    found = Endpoint(
        host=one("hostname") or name,
        port=int(one("port") or 22),
        user=one("user") or getpass.getuser(),
        identity_files=tuple(settings.get("identityfile", [])) or DEFAULT_IDENTITIES,
        identity_named=identity_named,
        known_hosts=tuple(" ".join(settings.get("userknownhostsfile", [])).split()) or USER_KNOWN_HOSTS,
        system_known_hosts=tuple(" ".join(settings.get("globalknownhostsfile", [])).split()) or SYSTEM_KNOWN_HOSTS,
        host_key_alias=one("hostkeyalias"),
        proxy_command=None if proxy_command in (None, "none") else proxy_command,
        certificate_files=tuple(settings.get("certificatefile", [])),
        identities_only=one("identitiesonly") == "yes",
    )
    jumps = one("proxyjump")
    return found, None if jumps in (None, "none") else jumps


def _from_ssh(name: str, port: int | None, user: str | None, identity: str | None) -> tuple[Endpoint, str | None]:
    settings = ssh_settings(name, port, user, identity)
    unsupported(name, settings)
    found, jumps = endpoint(name, settings, identity is not None)
    if identity:  # login.identity_file alone, as before (ssh -G lists the config's files after it)
        found = dataclasses.replace(found, identity_files=(identity,))
    if found.proxy_command:
        found = dataclasses.replace(found, proxy_command=_proxy_command(name, found))
    return found, jumps


def _from_paramiko(
    config: Any, name: str, port: int | None, user: str | None, identity: str | None
) -> tuple[Endpoint, str | None]:
    entry = config.lookup(name)  # paramiko has filled in ProxyCommand's tokens
    unsupported(name, {key: value if isinstance(value, list) else [value] for key, value in entry.items()})
    named = [identity] if identity else list(entry.get("identityfile", []))
    endpoint = Endpoint(
        host=entry.get("hostname", name),
        port=port or int(entry.get("port", 22)),
        user=user or entry.get("user") or getpass.getuser(),
        identity_files=tuple(named) or DEFAULT_IDENTITIES,
        identity_named=bool(named),
        known_hosts=tuple((entry.get("userknownhostsfile") or USER_KNOWN_HOSTS[0]).split()),
        host_key_alias=entry.get("hostkeyalias"),
        proxy_command=None if entry.get("proxycommand") in (None, "none") else entry["proxycommand"],
        certificate_files=tuple(entry.get("certificatefile", [])),
        identities_only=entry.get("identitiesonly") == "yes",
    )
    jumps = entry.get("proxyjump")
    return endpoint, None if jumps in (None, "none") else jumps


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
    if not host or host.startswith("-"):
        raise SSHError(f"ProxyJump {spec!r} names no host")
    return user or None, host, port


def resolve(login: Login, config_without_ssh: Callable[[], Any]) -> list[Endpoint]:
    """The servers to go through, jump hosts first, the login node last. ``config_without_ssh``
    gives paramiko's SSHConfig, read only where there is no ``ssh -G``."""
    lookup = _from_ssh if ssh_program() else functools.partial(_from_paramiko, config_without_ssh())
    target, jumps = lookup(login.host, login.port, login.user, login.identity_file)
    jumps = login.proxy_jump or jumps
    hops = []
    for spec in jumps.split(",") if jumps else []:
        user, host, port = _parse_jump(spec.strip())
        hop, hop_jumps = lookup(host, port, user, None)
        if hop_jumps:
            raise SSHError(
                f"jump host {host} has a ProxyJump of its own ({hop_jumps}): the paramiko transport "
                f"takes one chain; name every hop in login.proxy_jump, or use login.transport: openssh"
            )
        hops.append(hop)
    if hops and target.proxy_command:
        raise SSHError(f"{login.host}: both ProxyJump and ProxyCommand are set; keep one")
    return [*hops, target]

"""A real OpenSSH server (Debian openssh-server) on a free loopback port, key-only, for the remote
submission tests. Each instance has its own host key, config and log, all under a temp directory."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NSS_WRAPPER = [
    f"{directory}/libnss_wrapper.so"
    for directory in (f"/usr/lib/{sysconfig.get_config_var('MULTIARCH')}", "/usr/lib64", "/usr/lib")
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


class SSHServer:
    def __init__(self, root: Path, authorized_keys: Path, slurm_conf: str | None = None):
        self.root = root
        self.port = free_port()
        root.mkdir(parents=True)
        self.host_key = keygen(root / "ssh_host_ed25519_key")
        self.log = root / "sshd.log"
        self.config = root / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {authorized_keys}\nAuthenticationMethods publickey\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            "AllowTcpForwarding yes\nLogLevel DEBUG1\nSubsystem sftp internal-sftp\n"
            # A login node's sessions know their cluster, as a site's /etc/profile would arrange.
            + (f"SetEnv SLURM_CONF={slurm_conf}\n" if slurm_conf else "")
        )
        self.process: subprocess.Popen | None = None

    @property
    def known_hosts_line(self) -> str:
        key_type, key = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key}\n"

    def start(self) -> SSHServer:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        self.process = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(self.log)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {self.log.read_text() if self.log.exists() else ''}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def client_home(root: Path, passphrase: str) -> tuple[Path, Path]:
    """A HOME for the client with an encrypted key; returns (home, public key file)."""
    ssh_dir = root / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700)
    key = keygen(ssh_dir / "id_ed25519", passphrase)
    return root, Path(f"{key}.pub")


def client_env(home: Path, passphrase: str | None) -> dict[str, str]:
    """The environment of a client whose home is ``home``. OpenSSH takes ``~`` from the account's passwd
    entry, not from $HOME: nss_wrapper gives this client an account whose home is ``home``, so ssh reads
    that ~/.ssh as it would a user's. Its master connections live in a short private directory of
    their own ($XDG_RUNTIME_DIR), one per home; :func:`stop_masters` ends them."""
    library = next((path for path in NSS_WRAPPER if os.path.exists(path)), None)
    if library is None:
        raise RuntimeError("the ssh tests need nss_wrapper: apt-get install libnss-wrapper (bin/setup installs it)")
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "CLUSTERKIT_SSH_PASSPHRASE")}
    accounts = home / ".nss"
    accounts.mkdir(mode=0o700, exist_ok=True)
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    (accounts / "passwd").write_text(f"{user}:x:{os.getuid()}:{os.getgid()}:{user}:{home}:/bin/sh\n")
    (accounts / "group").write_text(f"{group}:x:{os.getgid()}:\n")
    env |= {
        "HOME": str(home),
        "LD_PRELOAD": library,
        "NSS_WRAPPER_PASSWD": str(accounts / "passwd"),
        "NSS_WRAPPER_GROUP": str(accounts / "group"),
        "XDG_RUNTIME_DIR": str(runtime_dir(home)),
    }
    if passphrase is not None:
        env["CLUSTERKIT_SSH_PASSPHRASE"] = passphrase
    return env


def runtime_dir(home: Path) -> Path:
    """A short directory for ``home``'s control sockets (a socket path holds about 104 bytes)."""
    path = Path(tempfile.gettempdir()) / f"ckssh-{hashlib.sha256(bytes(home)).hexdigest()[:12]}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def masters(home: Path) -> list[Path]:
    directory = runtime_dir(home) / "clusterkit-ssh"
    return sorted(p for p in directory.glob("*") if p.is_socket()) if directory.is_dir() else []


def stop_masters(home: Path) -> None:
    """End the master connections clusterkit's ssh left for ``home`` (sshd keeps them when it stops)."""
    for socket_path in masters(home):
        subprocess.run(
            ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "--", "master"],
            capture_output=True,
            timeout=10,
            check=False,
        )


def forget_client(home: Path) -> None:
    """At the end: no master connection left for ``home``, nor its socket directory."""
    stop_masters(home)
    shutil.rmtree(runtime_dir(home), ignore_errors=True)

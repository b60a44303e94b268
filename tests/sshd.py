"""A real OpenSSH server (Debian openssh-server) on a free loopback port, key-only, for the remote
submission tests. Each instance has its own host key, config and log, all under a temp directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", path.name, "-f", str(path)],
                   check=True, capture_output=True)
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

    def start(self) -> "SSHServer":
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
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "CLUSTERKIT_SSH_PASSPHRASE")}
    env["HOME"] = str(home)
    if passphrase is not None:
        env["CLUSTERKIT_SSH_PASSPHRASE"] = passphrase
    return env

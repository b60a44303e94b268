"""What `submit --dry-run` shows and what the login node is told to do with the words a profile or a
folder gives: a remote_workdir that reads as an option (`-P`, `-`) is a folder to `cd` into, shown
quoted; file names with escape sequences in a code snapshot are shown escaped, never sent to the
terminal as they are. The SSH session here is this machine's bash, no sshd needed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.ssh import SSHHost
from clusterkit.schedulers.ssh_transport import Session, command_line
from clusterkit.spec.profile import Login
from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"


@dataclass
class _Endpoint:
    host: str


class BashSession(Session):
    """The login node's shell, here: each command line run by bash in ``home``, as sshd runs it."""

    def __init__(self, home: Path):
        self.home = home
        self.endpoint = _Endpoint("bash-here")  # type: ignore[assignment]
        self.commands: list[str] = []

    def run(self, command, timeout=120.0, stdin=None, stdout=None, stderr=None) -> Completed:
        self.commands.append(command)
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.home,
            input=stdin or b"",
            capture_output=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "HOME": str(self.home), "OLDPWD": "/"},
        )
        return Completed(done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.mark.parametrize("workdir", ["-P", "-", "-L", "--", "-x ~%", "~/-P", "sub/-P"])
def test_a_remote_workdir_that_reads_as_an_option_is_the_folder(workdir: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    session = BashSession(home)
    host = SSHHost(session, Login(host="login", remote_workdir=workdir))
    expected = home / workdir.removeprefix("~/")
    assert host.workdir == str(expected)  # `cd -P` went home, `cd -` to OLDPWD
    assert expected.is_dir()
    host.write_file("note.txt", "hello\n")
    assert (expected / "note.txt").read_text() == "hello\n"
    assert host.run(["cat", "note.txt"]).stdout == "hello\n"


@pytest.mark.parametrize("cwd", ["-P", "-", "a b", "-x ~%"])
def test_command_lines_cd_into_a_folder_never_an_option(cwd: str) -> None:
    line = command_line(["pwd"], cwd=cwd)
    assert line.startswith("cd -- ") and shlex.split(line)[2] in (cwd, f"./{cwd}")
    assert shlex.split(line)[2] != "-"  # `cd -- -` still means OLDPWD to bash


def _profile(tmp_path: Path, workdir: str) -> Path:
    data = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    data.update(name="remote", login={"host": "cluster-login", "remote_workdir": workdir})
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("workdir", ["-P", "a'b $(touch pwned) c", "my runs"])
def test_the_dry_run_shows_the_remote_workdir_quoted(workdir: str, tmp_path: Path) -> None:
    done = run_cli("submit", str(TINY), "--cluster", str(_profile(tmp_path, workdir)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.endswith(f" (in {shlex.quote(workdir)} on cluster-login)"), first
    assert shlex.split(first.split("(in ", 1)[1].rsplit(" on ", 1)[0]) == [workdir]


HOSTILE_NAMES = ["\x1b[2J\x1b[31mred.py", "bell\x07.py", "line\nbreak.py", "tab\there.py", "csi\x9b31m.py"]


def test_snapshot_file_names_with_escape_sequences_are_shown_escaped(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    for name in HOSTILE_NAMES:
        (code / name).write_text("x\n")
        os.symlink("/etc/passwd", code / f"out-{name}")  # left out (points outside): named in the summary
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: s\nresources: {{nodes: 1, gpus_per_node: 1, time: '5'}}\n"
        f"task: {{script: {code / 'train.py'}}}\nsnapshot: {{dir: {code}}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", "submit", str(recipe), "--dry-run", "--executor", "local"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = [line for line in done.stderr.split(b"\n") if line.startswith(b"# code snapshot")]
    assert len(summary) == 1, done.stderr
    assert not any(byte < 0x20 or byte == 0x7F for byte in summary[0]), summary[0]
    assert "\x9b" not in summary[0].decode()
    assert "out-\\x1b[2J\\x1b[31mred.py -> /etc/passwd" in summary[0].decode(), summary[0]

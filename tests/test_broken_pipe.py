"""`clusterkit ... | head -1`: the reader going away ends the command quietly (no traceback, no
"Exception ignored" at exit) with status 1, as the Python docs' recipe and rich's Console (which
prints the tables) end it.

The pipes are real shell pipes into `head -1`. To make the reader certainly gone before clusterkit
writes, `head` first gets a line of its own and clusterkit starts only after it has left; the long
`ls` also breaks the pipe mid-output (more than a pipe buffer of rows), with no such help."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from clusterkit.runs.record import RunRecord
from conftest import RECIPES, REPO

CLI = f"{shlex.quote(sys.executable)} -m clusterkit.cli.main"


def _into_head(command: str, tmp_path: Path, reader_first: bool, buffered: bool = True) -> tuple[str, str, int]:
    """``command | head -1`` in a real shell: what head printed, clusterkit's stderr and status.
    ``buffered``: stdout as a user's Python has it (the output meets the closed pipe when flushed,
    at the end), else as PYTHONUNBUFFERED has it (at each write)."""
    err, status = tmp_path / "stderr", tmp_path / "status"
    writer = f"{CLI} {command} 2>{shlex.quote(str(err))}; echo $? >{shlex.quote(str(status))}"
    if reader_first:
        writer = f"echo from-head; sleep 0.5; {writer}"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        ["bash", "-c", f"{{ {writer}; }} | head -1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPATH": str(REPO), **({} if buffered else {"PYTHONUNBUFFERED": "1"})},
    )
    return done.stdout, err.read_text(), int(status.read_text())


@pytest.mark.parametrize(
    "command",
    [
        "schema",
        f"plan {RECIPES / 'llama-7b-zero3-ib.yaml'} --json",
        f"validate {RECIPES / 'ddp-1node-8gpu.yaml'}",
        f"plan {RECIPES / 'llama-7b-zero3-ib.yaml'}",  # rich tables
        "doctor",  # a rich table; exit 1 either way here (no GPU)
        "--help",
    ],
    ids=["schema", "plan-json", "validate", "plan-table", "doctor", "help"],
)
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_reader_that_left_ends_the_command_quietly(command: str, buffered: bool, tmp_path: Path) -> None:
    out, err, status = _into_head(command, tmp_path, reader_first=True, buffered=buffered)
    assert out == "from-head\n"
    assert "Traceback" not in err and "Exception ignored" not in err and "Broken pipe" not in err, err
    assert status in (0, 1)  # 0: argparse writes its help in one write and ignores the error


def test_long_ls_into_head(tmp_path: Path) -> None:
    runs = tmp_path / "runs with spaces % ~"
    for index in range(1500):  # ~200 KB of rows: head leaves with most still to write
        run_dir = runs / "run" / str(index)
        run_dir.mkdir(parents=True)
        RunRecord(
            job_id=str(index),
            name="run",
            scheduler="local",
            run_dir=str(run_dir),
            recipe="r.yaml",
            submitted_at=1_700_000_000 + index,
            nodes=1,
            ranks_per_node=1,
            launcher="torchrun",
        ).write()
    out, err, status = _into_head(f"ls --limit 1500 --runs-dir {shlex.quote(str(runs))}", tmp_path, reader_first=False)
    assert out.split() == ["JOB", "NAME", "STATE", "SUBMITTED", "LAYOUT", "RUN", "DIR"]
    assert err == "" and status == 1


def test_a_broken_pipe_of_our_own_is_still_reported(tmp_path: Path) -> None:
    """A connection of ours that breaks (an SSH channel) while stdout is fine is a failure to say."""
    code = (
        "import errno, sys\n"
        "import clusterkit.cli.recipes as commands\n"
        "def broken(args): raise BrokenPipeError(errno.EPIPE, 'Broken pipe')\n"
        "commands.cmd_schema = broken\n"
        "from clusterkit.cli.main import main\n"
        "sys.exit(main(['schema']))\n"
    )
    with (tmp_path / "out").open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert done.returncode == 1 and done.stderr == "clusterkit: Broken pipe\n"

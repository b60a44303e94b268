"""Child processes of the GPU proof: each run its own process group, its output streamed into the log
(prefixed) and its tail kept, and stopped at its time limit, its workers with it (data loader and
torch.compile workers are in the group)."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KILL_GRACE_S = 10


@dataclass
class Outcome:
    argv: list[str]
    returncode: int | None  # None: stopped at its time limit
    seconds: float
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def why(self) -> str:
        """One line for a failed run: the time limit, or the exit status and the last error-looking line."""
        if self.returncode is None:
            return f"stopped at its time limit after {self.seconds:.0f} s"
        # The rank's own exception, not torchrun's ChildFailedError about it.
        errors = [
            line
            for line in self.tail
            if re.search(r"\w(Error|Exception|Mismatch)\b.*:", line) and "ChildFailedError" not in line
        ]
        last = (errors or self.tail or [""])[-1].strip()
        return f"exit status {self.returncode}" + (f": {last[:300]}" if last else "")


def run_logged(
    argv: list[str],
    timeout_s: float,
    label: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    tail_lines: int = 60,
) -> Outcome:
    """Run ``argv``; every line it prints goes to our stdout as ``[label] line``."""
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    child = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def pump() -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(line)
            sys.stdout.write(f"[{label}] {line}\n")
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        returncode: int | None = child.wait(timeout=max(1.0, timeout_s))
        # What the run left behind in its group (a data loader or compile worker) must not hold the
        # GPU, or its memory, into the next run.
        _signal_group(child.pid, signal.SIGKILL)
    except subprocess.TimeoutExpired:
        returncode = None
        stop_group(child)
    except BaseException:  # Ctrl-C: the child's group goes too
        stop_group(child)
        raise
    reader.join(timeout=5)
    return Outcome(argv, returncode, time.monotonic() - started, list(tail))


def _signal_group(group: int, sig: signal.Signals) -> bool:
    """Whether the group still had a process to signal."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False


def descendants(root: int) -> dict[int, int]:
    """Every process below ``root``, pid -> process group, read from /proc. torchrun starts each rank
    in a session of its own (its data loader and compile workers with it), out of reach of a signal
    to torchrun's group; torchrun stops them itself, unless it is killed first."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = (int(fields[1]), int(fields[2]))
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, group) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = group
                frontier.append(pid)
    return found


def stop_group(child: subprocess.Popen) -> None:
    """TERM to the child's own process group (it was started in a new session), then, after a grace,
    KILL to it and to every process group below it (the ranks torchrun started in sessions of their own)."""
    below = descendants(child.pid)
    if _signal_group(child.pid, signal.SIGTERM):
        try:
            child.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    for group in {child.pid, *below.values()}:
        _signal_group(group, signal.SIGKILL)
    child.wait()


def torchrun(module_args: list[str]) -> list[str]:
    """One rank on this machine, as a one-GPU job's torchrun starts it."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "1",
        *module_args,
    ]


def with_env_script(env_script: Path, argv: list[str]) -> list[str]:
    """``argv`` under the environment the job's rendered env.sh sets (NCCL, OMP threads), as in a job."""
    return ["bash", "-c", '. "$1" && shift && exec "$@"', "bench", str(env_script), *argv]


RANK_RESULT = "bench-rank.json"  # bench.gpu.rank's own record, beside the runner's in the run directory
MEMORY_KEYS = ("peak_allocated", "peak_reserved", "device_used_at_end", "max_rss_bytes")


def read_json(path: Path) -> Any:
    """The file's JSON; None where it is missing or cut short (its writer was killed)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def train_rank(
    repo: Path, run_dir: Path, timeout_s: float, label: str, env: dict[str, str] | None = None
) -> tuple[Outcome, dict[str, Any]]:
    """The built-in runner on the run directory's job.json, one rank under torchrun and env.sh, as a
    one-GPU job runs it; its outcome and bench.gpu.rank's record (peak memory, the error it raised)."""
    argv = torchrun(["-m", "bench.gpu.rank", str(run_dir / "job.json"), str(run_dir / RANK_RESULT)])
    outcome = run_logged(with_env_script(run_dir / "env.sh", argv), timeout_s, label, cwd=repo, env=env)
    return outcome, read_json(run_dir / RANK_RESULT) or {}

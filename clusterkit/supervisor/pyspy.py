"""py-spy, where it is installed, for the ranks on this node that did not answer the stacks signal:
a rank whose Python skipped the site folder (``python -I``, a container that resets PYTHONPATH), one
stopped (SIGSTOP, a debugger) or one that started before its RANK was known. Run by each node agent,
``GRACE_S`` after the signal came (faulthandler answers at once); its dump goes beside the others as
``rank<R>-node<N>-pid<P>.pyspy.txt``. py-spy needs ptrace permission over the rank (the same user,
and where the kernel's Yama ptrace_scope allows it); where it is refused, the agent says so in its
log and the rank stays without stacks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .processes import descendants

GRACE_S = 2.0  # after the signal: a process that registered has written its dump by then
DUMP_TIMEOUT_S = 8.0


def _start_env(pid: int) -> Dict[str, str]:
    """The environment a process started with (/proc/<pid>/environ)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            items = environ.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode("utf-8", "replace").split("=", 1) for item in items if b"=" in item)


def silent_ranks(root: int, answered: List[int]) -> List[Tuple[int, str]]:
    """(pid, rank) of the rank processes at or below ``root`` whose pid is not in ``answered``: a
    rank's own process has RANK in the environment it started with and a parent without it."""
    found = []
    for pid in [root, *descendants(root)]:
        rank = _start_env(pid).get("RANK")
        if rank is None or not rank.isdigit() or pid in answered:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if _start_env(parent).get("RANK") != rank:  # not a data-loader worker of the rank
            found.append((pid, rank))
    return found


def fill_in(root: int, folder: Path, node: str, answered: List[int], py_spy: Optional[str] = None) -> None:
    """Dump, with py-spy, every silent rank below ``root``; nothing where py-spy is not installed."""
    py_spy = py_spy or shutil.which("py-spy")
    if py_spy is None:
        return
    for pid, rank in silent_ranks(root, answered):
        try:
            done = subprocess.run(
                [py_spy, "dump", "--pid", str(pid)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=DUMP_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"clusterkit: py-spy could not dump rank {rank} (pid {pid}): {exc}", file=sys.stderr, flush=True)
            continue
        text = done.stdout.decode("utf-8", "replace")
        if done.returncode != 0:
            reason = text.strip().splitlines()[-1] if text.strip() else f"exit {done.returncode}"
            print(f"clusterkit: py-spy could not dump rank {rank} (pid {pid}): {reason}", file=sys.stderr, flush=True)
            continue
        path = folder / f"rank{rank}-node{node}-pid{pid}.pyspy.txt"
        try:
            folder.mkdir(parents=True, exist_ok=True)  # no rank registered: nothing made it yet
            with open(path, "a") as out:  # a later taking appends: the newest dump is the last
                out.write(text)
        except OSError as exc:
            print(f"clusterkit: cannot write {path}: {exc.strerror}", file=sys.stderr, flush=True)


def answered_pids(folder: Path, before: Dict[str, int]) -> List[int]:
    """The pids whose dump files grew since ``before`` (their sizes when the signal came)."""
    from .stacks import dump_pid, sizes

    return [pid for name, size in sizes(folder).items() if size > before.get(name, 0) and (pid := dump_pid(name))]

"""Processes below this one, read from /proc: who descends from whom, and who handles a signal.

The preemption signal is passed on only to processes that catch it (a handler installed: the
``SigCgt`` mask of /proc/<pid>/status). One that has the default action would die of it, and one that
ignores it has said it does not want it; both are left alone. A handler that exists is a handler
that asked, so Lightning's auto-requeue, which arms only where no handler was set before it, works.
"""

from __future__ import annotations

import os
import signal
from typing import Dict, Iterable, List, Optional

NOT_FOUND, NOT_EXECUTABLE = 127, 126  # a program that cannot be started, as a shell reports it


def _parents() -> Dict[int, int]:
    """pid -> parent pid of every process visible now."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
                after = stat.read().rsplit(b")", 1)[1].split()
            parents[int(entry)] = int(after[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return parents


def descendants(root: int) -> List[int]:
    """Every process below ``root`` (children first), as /proc shows them now."""
    children: Dict[int, List[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum``."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def signal_catchers(pids: Iterable[int], signum: int) -> List[int]:
    """Send ``signum`` to each of ``pids`` that handles it; the pids signalled."""
    sent = []
    for pid in pids:
        if catches(pid, signum):
            try:
                os.kill(pid, signum)
                sent.append(pid)
            except ProcessLookupError:
                pass
    return sent


def exit_status(returncode: Optional[int]) -> int:
    """A process's end as a shell reports it: its code, or 128+N when signal N ended it."""
    if returncode is None:
        return 1
    return returncode if returncode >= 0 else 128 - returncode


def signal_number(name: str) -> int:
    """``USR2`` -> signal.SIGUSR2."""
    return int(getattr(signal, "SIG" + name))

"""Every rank's Python stacks, on demand: each Python process of the job has faulthandler registered
on :data:`STACKS_SIGNAL` (``site/sitecustomize.py``, put on its path by the node agent), writing
all its threads' stacks into the run directory's ``ranks/stacks/`` (one file per process, named by
rank, node and pid). Asking is sending that signal to the job's processes (SIGWINCH, whose default
action is to ignore it: a process that has not registered is untouched); the dumps that grew since
are read back and summarised, ranks grouped by the innermost frame of their main thread, the odd
ones named with their node ("3 of 4 ranks wait in all_reduce at train.py:88; rank 1 on node 1 is in
data.py:40"). Used by the supervisor's watchdog and by ``clusterkit stacks``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .run_files import write_whole

STACKS_SIGNAL = signal.SIGWINCH
# scancel --signal has no name for it (found on the dev cluster: "Unknown job signal: WINCH"): its
# number, 28 on Linux on every architecture.
STACKS_SIGNAL_NUMBER = int(STACKS_SIGNAL)
# rank<R>-node<N>-pid<P>.txt; a process a rank started (a data loader) is "-child"; ".pyspy": py-spy's
# dump of a rank that did not answer the signal (pyspy.py).
_FILE = re.compile(
    r"^rank(?P<rank>\d+|-)-node(?P<node>\d+|-)-pid(?P<pid>\d+)(?P<child>-child)?(?P<pyspy>\.pyspy)?\.txt$"
)
# py-spy dump's own format: 'Thread 123 (idle): "MainThread"', then '    func (file.py:12)' lines
_PYSPY_THREAD = re.compile(r'^Thread (?P<id>\S+) \([^)]*\)(?:: "(?P<name>.*)")?$')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>.+) \((?P<file>.+):(?P<line>\d+)\)$")
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')

Frame = Tuple[str, int, str]  # file, line, function


@dataclass
class Sample:
    """One process's dump: its rank and node (from the file name), and each thread's frames,
    innermost first (faulthandler writes the most recent call first)."""

    rank: Optional[int]
    node: Optional[int]
    pid: int
    child: bool
    threads: List[Tuple[bool, List[Frame]]] = field(default_factory=list)  # (current, frames)
    method: str = "faulthandler"  # or py-spy

    def to_dict(self, hosts: Sequence[str] = ()) -> dict:
        return {
            "rank": self.rank,
            "node": self.node,
            "host": node_name(self.node, hosts),
            "pid": self.pid,
            "child": self.child,
            "method": self.method,
            "where": _frame_text(self.where),
            "threads": [
                {"current": current, "frames": [{"file": f, "line": n, "function": fn} for f, n, fn in frames]}
                for current, frames in self.threads
            ],
        }

    @property
    def where(self) -> Optional[Frame]:
        """The innermost frame of the thread that took the signal (the main thread)."""
        for current, frames in self.threads:
            if current and frames:
                return frames[0]
        return self.threads[0][1][0] if self.threads and self.threads[0][1] else None


def parse_pyspy(text: str) -> List[Tuple[bool, List[Frame]]]:
    """The threads of py-spy's dump (the last, where the text holds several); the main thread counts
    as the one that would have taken the signal."""
    threads: List[Tuple[bool, List[Frame]]] = []
    for line in text.splitlines():
        if line.startswith("Process "):
            threads = []  # a newer dump starts
            continue
        thread = _PYSPY_THREAD.match(line)
        if thread:
            threads.append((thread.group("name") == "MainThread", []))
            continue
        frame = _PYSPY_FRAME.match(line)
        if frame and threads:
            threads[-1][1].append((frame.group("file"), int(frame.group("line")), frame.group("func")))
    return threads


def dump_pid(name: str) -> Optional[int]:
    match = _FILE.match(name)
    return int(match.group("pid")) if match else None


def parse(text: str) -> List[Tuple[bool, List[Frame]]]:
    """The threads of a faulthandler dump (the last dump, where the text holds several)."""
    threads: List[Tuple[bool, List[Frame]]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            if thread.group("current") == "Current thread" and threads and any(c for c, _ in threads):
                threads = []  # a newer dump starts: its threads replace the older one's
            threads.append((thread.group("current") == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append((frame.group("file"), int(frame.group("line")), frame.group("func")))
    return threads


def _is_rank(name: str) -> bool:
    """A rank's own process (not a launcher, node agent or a rank's child)."""
    match = _FILE.match(name)
    return bool(match) and match.group("rank") != "-" and not match.group("child")  # type: ignore[union-attr]


def _number(text: str) -> Optional[int]:
    return None if text == "-" else int(text)


def sizes(folder: Path) -> Dict[str, int]:
    """How long each dump file is now (what a request adds is read after this)."""
    try:
        return {entry.name: entry.stat().st_size for entry in os.scandir(folder) if _FILE.match(entry.name)}
    except OSError:
        return {}


def collect(
    folder: Path,
    request: Callable[[], None],
    ranks: int,
    timeout_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> List[Sample]:
    """Ask for every process's stacks (``request`` sends the signal) and read what each wrote,
    waiting until ``ranks`` rank processes have answered or ``timeout_s`` has passed."""
    before = sizes(folder)
    request()
    deadline = time.monotonic() + timeout_s
    while True:
        grown = {name: size for name, size in sizes(folder).items() if size > before.get(name, 0)}
        answered = sum(1 for name in grown if _is_rank(name))
        if answered >= ranks or time.monotonic() >= deadline:
            break
        sleep(0.2)
    sleep(0.3)  # a dump being written: let it end
    samples = []
    for name in sorted(sizes(folder)):
        start = before.get(name, 0)
        try:
            with open(folder / name, "rb") as dump:
                dump.seek(start)
                text = dump.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            continue
        if not text.strip():
            continue
        match = _FILE.match(name)
        samples.append(
            Sample(
                _number(match.group("rank")),  # type: ignore[union-attr]
                _number(match.group("node")),  # type: ignore[union-attr]
                int(match.group("pid")),  # type: ignore[union-attr]
                bool(match.group("child")),  # type: ignore[union-attr]
                parse_pyspy(text) if match.group("pyspy") else parse(text),  # type: ignore[union-attr]
                "py-spy" if match.group("pyspy") else "faulthandler",  # type: ignore[union-attr]
            )
        )
    return samples


def _frame_text(frame: Optional[Frame]) -> str:
    if frame is None:
        return "no Python frame"
    return f"{frame[2]} at {os.path.basename(frame[0])}:{frame[1]}"


@dataclass
class Summary:
    """Ranks grouped by where they are; ``odd`` the ranks outside the largest group."""

    groups: List[Tuple[str, List[int]]]  # (where, ranks), the largest first
    odd: List[Tuple[int, Optional[int], str]]  # (rank, node, where)
    missing: List[int]  # ranks that wrote no stacks (not a Python process, or gone)
    line: str

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "groups": [{"where": where, "ranks": ranks} for where, ranks in self.groups],
            "odd": [{"rank": rank, "node": node, "where": where} for rank, node, where in self.odd],
            "missing": self.missing,
        }


def node_name(node: Optional[int], hosts: Sequence[str]) -> str:
    if node is None:
        return "an unknown node"
    return hosts[node] if 0 <= node < len(hosts) else f"node {node}"


def summarise(samples: Sequence[Sample], world: int, hosts: Sequence[str] = (), ranks_per_node: int = 0) -> Summary:
    """One line a person reads first, and the groups behind it. A rank that wrote nothing (stopped,
    stuck in the kernel, or no Python) is named with the node its place in the layout puts it on."""
    ranks: "OrderedDict[int, Sample]" = OrderedDict()
    for sample in samples:
        if sample.rank is not None and not sample.child:
            ranks[sample.rank] = sample
    by_where: Dict[str, List[int]] = {}
    for rank in sorted(ranks):
        by_where.setdefault(_frame_text(ranks[rank].where), []).append(rank)
    groups = sorted(by_where.items(), key=lambda item: (-len(item[1]), item[1][0]))
    missing = [rank for rank in range(world) if rank not in ranks]
    odd = [(rank, ranks[rank].node, where) for where, members in groups[1:] for rank in members]

    parts = []
    if groups:
        where, members = groups[0]
        parts.append(f"{len(members)} of {world} ranks are in {where}")
    parts += [f"rank {rank} on {node_name(node, hosts)} is in {where}" for rank, node, where in odd]
    if missing:
        where = ""
        if ranks_per_node and hosts:
            nodes = dict.fromkeys(node_name(rank // ranks_per_node, hosts) for rank in missing)
            where = f" (on {', '.join(nodes)})"
        parts.append(f"no stacks from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}{where}")
    return Summary(groups, odd, missing, "; ".join(parts) or "no stacks came back")


METHOD = "faulthandler (SIGWINCH, registered by the supervisor's sitecustomize in every rank and its children)"


def method(samples: Sequence[Sample]) -> str:
    """How the stacks were taken: faulthandler, and py-spy for the ranks that did not answer it."""
    spied = sorted({s.rank for s in samples if s.method == "py-spy" and s.rank is not None})
    if not spied:
        return METHOD
    return f"{METHOD}; py-spy for rank{'s' if len(spied) > 1 else ''} {', '.join(map(str, spied))}, which did not answer it"


def record(
    path: Path,
    samples: Sequence[Sample],
    summary: Summary,
    hosts: Sequence[str],
    reason: str,
    serial: int,
    nccl_dir: Optional[Path] = None,
) -> None:
    """The summary and every process's frames, written whole (``clusterkit stacks`` reads it), with
    the NCCL flight recorder's dumps where a collective timed out on a GPU (``nccl_dir``)."""
    try:
        nccl = sorted(entry.name for entry in os.scandir(nccl_dir)) if nccl_dir else []
    except OSError:
        nccl = []
    data = {
        "nccl_dumps": {"dir": str(nccl_dir), "files": nccl} if nccl else None,
        "serial": serial,  # grows with each taking: a reader waits for a new one
        "time": time.time(),
        "reason": reason,
        "method": method(samples),
        "summary": summary.to_dict(),
        "processes": [sample.to_dict(hosts) for sample in samples],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(data, indent=1) + "\n")


def last_serial(path: Path) -> int:
    try:
        return int(json.loads(path.read_text()).get("serial", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0

"""``clusterkit stacks``, on this side: the summary the job's supervisor wrote (``STACKS_SUMMARY``)
read back, narrowed to a rank or a node, and printed for a person.

The supervisor takes the stacks inside the allocation (:mod:`clusterkit.supervisor.stacks`); this
module only reads what it wrote, from wherever the run lives (a path here, a file on a login node).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

from clusterkit.errors import UsageError
from clusterkit.runs.logs import Readable, read_run_file

SUMMARY_LIMIT = 64 << 20  # a few thousand ranks' frames; past this the file is not the supervisor's
FRAMES_SHOWN = 12  # innermost frames per thread in the text output (--json has them all)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def read_summary(file: Readable) -> dict | None:
    """The last summary the supervisor wrote, or None (none yet, or not one it wrote whole)."""
    try:
        data = json.loads(read_run_file(file, SUMMARY_LIMIT, "the stacks summary"))
    except (OSError, ValueError, UsageError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("serial"), int) else None


def narrowed(summary: dict, rank: int | None = None, node: str | None = None) -> dict:
    """The summary with only the processes of ``rank`` (and its children) or of ``node`` (an index
    or a host name); the summary line stays the whole job's."""
    processes = [p for p in summary.get("processes", []) if isinstance(p, dict)]
    if rank is not None:
        processes = [p for p in processes if p.get("rank") == rank]
    if node is not None:
        processes = [p for p in processes if str(p.get("node")) == node or p.get("host") == node]
    if (rank is not None or node is not None) and not processes:
        which = f"rank {rank}" if rank is not None else f"node {node}"
        raise UsageError(f"no stacks from {which} in this taking (ranks and nodes shown: {_present(summary)})")
    return {**summary, "processes": processes}


def _present(summary: dict) -> str:
    processes = [p for p in summary.get("processes", []) if isinstance(p, dict)]
    ranks = sorted({p["rank"] for p in processes if isinstance(p.get("rank"), int)})
    hosts = sorted({str(p.get("host")) for p in processes})
    return f"ranks {', '.join(map(str, ranks)) or 'none'}; nodes {', '.join(hosts) or 'none'}"


def shown(text: object) -> str:
    """Text from the job (file and function names) made safe for a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _shown_order(process: dict) -> tuple:
    """The ranks first, by rank, each before its children; then launchers and node agents."""
    rank = process.get("rank")
    return (not isinstance(rank, int), rank if isinstance(rank, int) else 0, bool(process.get("child")))


def text_lines(job_id: str, summary: dict) -> Iterator[str]:
    when = time.strftime("%H:%M:%S", time.localtime(summary.get("time") or 0))
    yield f"job {shown(job_id)}: stacks taken at {when} by {shown(summary.get('method'))}"
    yield shown((summary.get("summary") or {}).get("line", ""))
    nccl = summary.get("nccl_dumps")
    if isinstance(nccl, dict) and nccl.get("files"):
        yield f"NCCL flight recorder dumps (a collective timed out): {len(nccl['files'])} in {shown(nccl.get('dir'))}"
    for process in sorted(summary["processes"], key=_shown_order):
        who = "rank " + str(process.get("rank")) if process.get("rank") is not None else "a launcher or agent"
        child = ", a child process" if process.get("child") else ""
        yield ""
        yield f"{who} on {shown(process.get('host'))} (pid {process.get('pid')}{child}), most recent call first:"
        for thread in process.get("threads", []):
            frames = thread.get("frames", [])
            yield f"  {'current thread' if thread.get('current') else 'thread'}:"
            for frame in frames[:FRAMES_SHOWN]:
                yield f"    {shown(frame.get('file'))}:{frame.get('line')} in {shown(frame.get('function'))}"
            if len(frames) > FRAMES_SHOWN:
                yield f"    ... {len(frames) - FRAMES_SHOWN} more (--json has every frame)"

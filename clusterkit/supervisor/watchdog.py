"""The launch step, watched: every rank's stacks taken when asked, and a launch that stops making
progress found, named and ended.

Progress is a change of ``metrics.jsonl`` (a new step line) or of the heartbeat file (the runner's
rank 0, or a script's ranks, touch ``$CLUSTERKIT_HEARTBEAT`` at each step). Before the first change
the plan's ``startup_s`` applies, after it ``no_progress_s``. What an earlier attempt left in those
files is where this one starts from: only a change counts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from . import stacks
from .environment import JobEnvironment
from .plan import LaunchPlan, Watchdog
from .run_files import HANG_RECORD, HEARTBEAT, METRICS, NCCL_TRACE_DIR, STACKS_DIR, STACKS_SUMMARY, write_whole
from .steps import Running

EXIT_HUNG = 124  # the launch's exit code when the watchdog ended it (as timeout(1) reports one)
WATCH_EVERY_S = 0.5  # how often a stacks request is looked for while the launch runs

Mark = Tuple[Optional[Tuple[int, int]], ...]


def progress_mark(run_dir: Path) -> Mark:
    """The progress files as they are now: a change is progress."""
    marks = []
    for path in (run_dir / METRICS, run_dir / HEARTBEAT):
        try:
            status = path.stat()
            marks.append((status.st_size, status.st_mtime_ns))
        except OSError:
            marks.append(None)
    return tuple(marks)


class Progress:
    def __init__(self, run_dir: Path, watchdog: Watchdog, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.watchdog, self.clock = run_dir, watchdog, clock
        self.mark = self._mark()
        self.since = clock()
        self.started = False  # the launch has made progress once

    def _mark(self) -> Mark:
        return progress_mark(self.run_dir)

    def stalled(self) -> Optional[str]:
        """Why the launch counts as hung now, or None while it makes progress."""
        mark, now = self._mark(), self.clock()
        if mark != self.mark:
            self.mark, self.since, self.started = mark, now, True
            return None
        limit = self.watchdog.no_progress_s if self.started else self.watchdog.startup_s
        idle = now - self.since
        if idle < limit:
            return None
        what = "no progress" if self.started else "no first step"
        return f"{what} for {int(idle)} s (watchdog.{'no_progress' if self.started else 'startup'}: {limit} s)"

    def rearm(self) -> None:
        """Count again from now (after stacks were taken and the job goes on)."""
        self.since = self.clock()

    @property
    def poll_s(self) -> float:
        """How often to look: often enough for the limit, not busily."""
        return max(0.5, min(10.0, min(self.watchdog.no_progress_s, self.watchdog.startup_s) / 10))


@dataclass(frozen=True)
class Hang:
    """The watchdog ended the launch: retried (``retry``) without the hosts in ``exclude``, or not."""

    retry: bool
    exclude: Tuple[str, ...]


class Watcher:
    """Watches a started launch until it ends: the stacks when asked (``asked``, set by the
    supervisor's SIGWINCH handler), and the watchdog's verdicts, each also told ``notify``
    (``hang`` and its line: Notifier.send)."""

    def __init__(
        self,
        plan: LaunchPlan,
        job: JobEnvironment,
        run_dir: Path,
        hosts: Sequence[str],
        notify: Callable[[str, str], None] = lambda event, text: None,
    ) -> None:
        self.plan, self.job, self.run_dir, self.hosts = plan, job, run_dir, list(hosts)
        self.notify = notify
        self.world = plan.train_nodes * plan.slots_per_node
        self.asked = False
        self.hang: Optional[Hang] = None
        # Called once, when the launch first makes progress (a restart's time lost ends there).
        self.on_first_progress: Optional[Callable[[], None]] = None

    def watch(self, running: Running, clock: Callable[[], float] = time.monotonic) -> int:
        watchdog = self.plan.watchdog
        progress = Progress(self.run_dir, watchdog, clock) if watchdog else None
        hung_at: Optional[Mark] = None  # the progress files when a hang was recorded and the launch went on
        every = min(WATCH_EVERY_S, progress.poll_s) if progress else WATCH_EVERY_S
        first, started_at = self.on_first_progress, progress_mark(self.run_dir)
        while True:
            code = running.poll(every)
            if code is not None:
                return code
            if first is not None and progress_mark(self.run_dir) != started_at:
                first()
                first = None
            if self.asked:
                self.asked = False
                self.take("asked (clusterkit stacks)")
            if progress is None:
                continue
            why = progress.stalled()
            if hung_at is not None and progress.mark != hung_at:
                hung_at = None
                _remove(self.run_dir / HANG_RECORD)
                print("clusterkit: the launch makes progress again", flush=True)
            if why is None:
                continue
            summary = self.take(f"watchdog: {why}")
            odd = sorted({stacks.node_name(node, self.hosts) for _, node, _ in summary.odd if node is not None})
            self._record(why, summary, odd)
            print(f"clusterkit: HUNG: {why}: {summary.line}", flush=True)
            self.notify("hang", f"HUNG: {why}: {summary.line} (watchdog.action: {watchdog.action})")
            if watchdog.action == "stacks":
                hung_at = progress.mark
                progress.rearm()
                continue
            self.hang = Hang(retry=watchdog.action == "retry", exclude=tuple(odd))
            print(f"clusterkit: ending the hung launch (watchdog.action: {watchdog.action})", flush=True)
            running.stop()
            return EXIT_HUNG

    def take(self, reason: str) -> stacks.Summary:
        """Every rank's stacks now: asked for, read back, summarised and recorded."""
        folder = self.run_dir / STACKS_DIR
        samples = stacks.collect(folder, lambda: self.job.signal_job(stacks.STACKS_SIGNAL), self.world)
        summary = stacks.summarise(samples, self.world, self.hosts, self.plan.slots_per_node)
        path = self.run_dir / STACKS_SUMMARY
        nccl = self.run_dir / NCCL_TRACE_DIR
        stacks.record(path, samples, summary, self.hosts, reason, stacks.last_serial(path) + 1, nccl)
        print(f"clusterkit: stacks of every rank ({reason}): {summary.line}; in {path}", flush=True)
        return summary

    def _record(self, why: str, summary: stacks.Summary, odd: List[str]) -> None:
        record = {
            "time": time.time(),
            "why": why,
            "line": summary.line,
            "action": self.plan.watchdog.action if self.plan.watchdog else None,
            "odd_hosts": odd,
            "stacks": STACKS_SUMMARY,
        }
        write_whole(self.run_dir / HANG_RECORD, json.dumps(record) + "\n")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass

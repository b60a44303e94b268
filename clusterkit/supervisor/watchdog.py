"""The watchdog of the launch step: is it making progress?

Progress is a change of ``metrics.jsonl`` (a new step line) or of the heartbeat file (a script's
ranks touch ``$CLUSTERKIT_HEARTBEAT``). Before the first change the plan's ``startup_s`` applies,
after it ``no_progress_s``. What an earlier attempt left in those files is where this one starts from.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .plan import Watchdog
from .run_files import HEARTBEAT, METRICS

Mark = Tuple[Optional[Tuple[int, int]], ...]


class Progress:
    def __init__(self, run_dir: Path, watchdog: Watchdog, clock: Callable[[], float] = time.monotonic) -> None:
        self.paths: List[Path] = [run_dir / METRICS, run_dir / HEARTBEAT]
        self.watchdog, self.clock = watchdog, clock
        self.mark = self._mark()
        self.since = clock()
        self.started = False  # the launch has made progress once

    def _mark(self) -> Mark:
        marks = []
        for path in self.paths:
            try:
                status = path.stat()
                marks.append((status.st_size, status.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

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

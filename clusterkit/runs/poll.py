"""How often a follower asks the scheduler: every second while things change, less and less often
while nothing does (1 s, 2, 4, 8, then every 10 s), and every second again after a change. Shared by
``--follow``, a sweep's follow and ``bench``, so a job that sits in the queue or trains quietly for
an hour costs a few calls a minute, not one a second, however many jobs are followed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

FIRST_S = 1.0
MAX_S = 10.0  # a job that ended is noticed within this long, however quiet it was before


@dataclass
class Backoff:
    """The wait before the next poll, from whether the last poll saw a change."""

    first_s: float = FIRST_S
    max_s: float = MAX_S
    factor: float = 2.0
    _wait_s: float = field(init=False, default=0.0)

    def after(self, changed: bool) -> float:
        """The first interval after a change, else the previous wait times ``factor``, at most
        ``max_s`` (or the first interval, if that is longer)."""
        longest = max(self.max_s, self.first_s)
        self._wait_s = self.first_s if changed or not self._wait_s else min(self._wait_s * self.factor, longest)
        return self._wait_s


def poll(
    ask: Callable[[], T],
    done: Callable[[T], bool],
    backoff: Backoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[T]:
    """Each answer of ``ask()`` until one is ``done``; between asks, the backoff's wait (back to the
    first interval whenever an answer differs from the one before)."""
    backoff = backoff or Backoff()
    previous: T | None = None
    while True:
        answer = ask()
        yield answer
        if done(answer):
            return
        sleep(backoff.after(answer != previous))
        previous = answer

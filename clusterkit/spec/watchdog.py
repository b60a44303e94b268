"""``watchdog:``: a job that stops making progress is found, its ranks' stacks are taken, and it is
ended (or retried without the node of the odd rank) instead of idling until its time limit.

Progress is a new line in ``metrics.jsonl`` (the built-in runner writes one per logging step; a
script may append the same ``{"event": "log", "step": N}`` line) or a touch of ``$CLUSTERKIT_HEARTBEAT``
(``Path(os.environ["CLUSTERKIT_HEARTBEAT"]).touch()`` each step). Before the first progress,
``startup`` applies (imports, rendezvous, loading a model), after it ``no_progress``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta

from clusterkit.spec.text import END

DURATION_PATTERN = rf"^[1-9][0-9]{{0,5}}(s|m|h)?{END}"  # at least a second; the Meta below caps an int
DURATION_HINT = "seconds, or a whole number with s, m or h (e.g. 90, 30s, 15m, 2h)"
Duration = Union[Annotated[int, Meta(ge=1, le=7 * 86_400)], Annotated[str, Meta(pattern=DURATION_PATTERN)]]
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600}


def seconds(value: int | str) -> int:
    """A duration as seconds: 90, "90", "30s", "15m", "2h"."""
    if isinstance(value, int):
        return value
    number, unit = re.fullmatch(r"(\d+)([smh]?)", value).groups()  # type: ignore[union-attr]
    return int(number) * _UNIT[unit]


class Watchdog(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    no_progress: Duration  # no new step for this long, once training has made progress: the job is hung
    startup: Duration = "30m"  # before the first step: imports, the rendezvous, loading the model
    # What a hang does, after every rank's stacks are taken and summarised into the run's record and
    # log: stacks (nothing more: the job goes on), fail (the job ends), retry (it ends, and its retry,
    # preemption.max_retries, runs without the node of the rank that was elsewhere).
    action: Literal["stacks", "fail", "retry"] = "fail"

"""``--follow``: stream a run's progress (step, loss, samples/s from metrics.jsonl) until it ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from clusterkit.runs.logs import Readable
from clusterkit.runs.poll import FIRST_S, Backoff, poll
from clusterkit.runs.record import RunRecord, metric_records
from clusterkit.runs.status import COMPLETED, JobStatus


class MetricsTail:
    """Reads the JSON lines appended to metrics.jsonl since the last call."""

    def __init__(self, path: Readable):
        self.path = path
        self._offset = 0

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self._offset += len(complete)
        return metric_records(complete.decode("utf-8", "replace"))


def _number(value: Any, digits: int) -> str:
    """A metric as a number with ``digits`` decimals; a value that is not one (a runner that logs
    its own things) as the text it is."""
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _describe(record: dict[str, Any]) -> str:
    parts = [f"step {record.get('step')}"]
    if record.get("loss") is not None:
        parts.append(f"loss {_number(record['loss'], 4)}")
    if record.get("samples_per_s"):
        parts.append(f"{_number(record['samples_per_s'], 1)} samples/s")
    parts.append(f"world {record.get('world_size')}")
    return ", ".join(parts)


def follow(
    record: RunRecord,
    status_of: Callable[[RunRecord], JobStatus],
    metrics: Readable,
    console: Console | None = None,
    poll_s: float = FIRST_S,
) -> JobStatus:
    """Follow until the job ends; returns its final status. ``status_of`` is the run's scheduler's,
    ``metrics`` the run's metrics.jsonl wherever it lives. Asked every ``poll_s`` while the job logs
    steps or changes state, less often while it does neither (:mod:`clusterkit.runs.poll`)."""
    console = console or Console()
    tail = MetricsTail(metrics)
    # Everything shown comes from the job or the scheduler: printed as Text, never read as rich
    # markup (a "[rank1]:" would vanish, a "[/]" would raise).
    columns = (
        TextColumn("{task.fields[state]}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}", markup=False),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(record.name, total=None, state="PENDING", info="")
        lagging = None  # the straggler last shown: a line when it appears or changes, not each poll
        for status, metrics_read in poll(
            lambda: (status_of(record), tail.new_records()), lambda answer: answer[0].done, Backoff(first_s=poll_s)
        ):
            for metric in metrics_read:
                max_steps = metric.get("max_steps")
                if isinstance(max_steps, int) and max_steps > 0:
                    progress.update(bar, total=max_steps)
                step = metric.get("step")
                progress.update(bar, completed=step if isinstance(step, int) else 0, info=_describe(metric))
                if metric.get("event") == "log":
                    progress.console.print(Text(f"  {_describe(metric)}"))
            if status.straggler and (lagging or {}).get("rank") != status.straggler.get("rank"):
                progress.console.print(Text(f"  straggler: {status.straggler['summary']}", style="yellow"))
            lagging = status.straggler
            progress.update(bar, state=status.state)
    # The job may have ended between the last read and the status check: report what it wrote.
    for metric in tail.new_records():
        if metric.get("event") == "log":
            console.print(Text(f"  {_describe(metric)}"))
    style = "green" if status.state == COMPLETED else "red"
    console.print(
        Text.assemble(
            (f"job {record.job_id} {status.state}", style),
            f" (exit code {status.exit_code})" if status.exit_code is not None else "",
        )
    )
    if status.failure:
        console.print(Text(f"first failure: {status.failure}", style="red"))
    return status

"""``clusterkit report``: where a run's allocation went (queue wait, start-up, training, checkpointing,
time lost to requeues, retries, restarts and hangs), its throughput, model FLOPs utilisation and
scaling efficiency; each figure with its source.

Pure: :func:`run_report` is a function of what the CLI gathered (:class:`RunFacts`: the run record,
job.json, metrics.jsonl, retries/restarts/hang records, sacct's rows, bench tables) to a
:class:`Report`. Nothing here reads a file or runs a command.

The allocation's time is cut at the runner's events: each ``start`` line of metrics.jsonl begins an
attempt (a job's launch, a requeued or retried job's, a restart on a spare), which is placed in the
allocation (sacct's row, one per job and per requeued instance) whose interval holds it. Of each
allocation: before its first attempt is start-up (the first allocation's) or the restart cost of the
requeue or retry that led to it; each attempt's span up to its last step that was kept (not redone
after a resume from an older checkpoint) is training, less its checkpoint saves; steps redone, and
the gap before an attempt that begins later in the same allocation, are lost to that restart; after
the last event, what remains is lost to the requeue or retry that ended the allocation, or, in the
last one, the run's shutdown ("other"). A hang (hang.json) is taken out of the loss it caused.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterkit.diagnose.run_time import BUCKETS, Allocation, Share, attempts_in, is_number, split_allocations
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers.slurm_accounting import JobAccounting, NoAccounting
from clusterkit.spec.resolved import JobFile

# Model FLOPs per token and parameter of a training step (forward 2, backward 4): MFU counts the
# model's FLOPs, not the recomputation gradient checkpointing adds (that would be hardware FLOPs).
TRAINING_FLOPS_PER_PARAM = 6
SACCT, LOCAL = "sacct", "run files"


@dataclass(frozen=True)
class Figure:
    """One number of the report; ``value`` None is "n/a" and ``why`` says why (else, where the
    figure is an estimate, what it assumes)."""

    value: float | None
    unit: str
    source: str
    why: str | None = None

    @staticmethod
    def missing(unit: str, why: str) -> Figure:
        return Figure(None, unit, "", why)


@dataclass(frozen=True)
class BenchTable:
    """A ``clusterkit bench`` result (bench.json) beside the run: its path and its scales."""

    path: str
    scales: list[dict[str, Any]]


@dataclass(frozen=True)
class RunFacts:
    """What the run left, as the CLI found it; a file that could not be read is empty here and its
    problem is in ``problems`` (file name -> why)."""

    record: RunRecord
    job: JobFile | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    hang: dict[str, Any] | None = None
    # sacct's rows for every job of the run; NoAccounting where there is none; None: not asked (local)
    accounting: list[JobAccounting] | NoAccounting | None = None
    bench: list[BenchTable] = field(default_factory=list)
    model_params: int | None = None
    problems: dict[str, str] = field(default_factory=dict)
    now: float = 0.0  # for a run still going: the end of its allocation so far


@dataclass(frozen=True)
class Report:
    job_id: str
    name: str
    scheduler: str
    source: str  # "sacct" or "run files" (the figures below are estimates there)
    note: str | None  # one line: which figures are estimates, and why
    jobs: list[Allocation]
    queue_wait: Figure
    wall: Figure
    gpu_hours: Figure
    cpu_hours: Figure
    shares: list[Share]
    shares_source: str
    samples_per_s: Figure
    tokens_per_s: Figure
    mfu: Figure
    scaling_efficiency: Figure
    vs_bench: Figure
    problems: dict[str, str]


def run_report(facts: RunFacts) -> Report:
    record = facts.record
    allocations, source, note = _allocations(facts)
    attempts = attempts_in(facts.metrics)
    shares = split_allocations(allocations, attempts, facts.hang, facts.restarts)
    has_metrics = bool(attempts)
    shares_source = f"{source} + metrics.jsonl" if has_metrics else source
    if not has_metrics:
        why = facts.problems.get("metrics.jsonl", "no metrics.jsonl lines (a task.script run, or none yet)")
        note = "; ".join(
            filter(None, [note, f"no training events ({why}): only losses the records name are split out"])
        )
    total_s = sum(a.elapsed_s for a in allocations)
    unit_source = SACCT if source == SACCT else f"estimate from {LOCAL}"
    first = allocations[0] if allocations else None
    if first is None:
        queue = wall = Figure.missing("s", "the run has not started")
    else:
        queue = (
            Figure(first.queue_wait_s, "s", SACCT)
            if first.queue_wait_s is not None
            else Figure.missing("s", "local executor: no queue" if record.scheduler == "local" else "no accounting")
        )
        wall = Figure(allocations[-1].ended - first.started, "s", unit_source)
    samples, tokens = _throughput(facts.metrics)
    scaling, vs_bench = _scaling(facts, samples)
    return Report(
        job_id=record.job_id,
        name=record.name,
        scheduler=record.scheduler,
        source=source,
        note=note,
        jobs=allocations,
        queue_wait=queue,
        wall=wall,
        gpu_hours=Figure(sum(a.gpus * a.elapsed_s for a in allocations) / 3600, "GPU-h", unit_source)
        if first
        else Figure.missing("GPU-h", "the run has not started"),
        cpu_hours=Figure(sum(a.cpus * a.elapsed_s for a in allocations) / 3600, "CPU-h", unit_source)
        if first
        else Figure.missing("CPU-h", "the run has not started"),
        shares=shares if total_s > 0 else [],
        shares_source=shares_source,
        samples_per_s=samples,
        tokens_per_s=tokens,
        mfu=_mfu(facts, tokens),
        scaling_efficiency=scaling,
        vs_bench=vs_bench,
        problems=dict(facts.problems),
    )


def _training_gpus(job: JobFile | None) -> int:
    if job is None or job.profile.accelerator != "gpu":
        return 0
    return job.recipe.resources.nodes * job.recipe.resources.gpus_per_node


def _allocations(facts: RunFacts) -> tuple[list[Allocation], str, str | None]:
    """sacct's rows, oldest first; else one allocation estimated from the run's own files."""
    if isinstance(facts.accounting, list) and facts.accounting:
        rows = sorted(
            (row for row in facts.accounting if row.started is not None), key=lambda row: row.started.timestamp()
        )
        return (
            [
                Allocation(
                    row.job_id,
                    row.state,
                    row.started.timestamp(),
                    row.ended.timestamp() if row.ended else row.started.timestamp() + row.elapsed_s,
                    row.gpus,
                    row.cpus,
                    row.queue_wait_s,
                )
                for row in rows
            ],
            SACCT,
            None,
        )
    if isinstance(facts.accounting, NoAccounting):
        why = facts.accounting.line
    elif facts.accounting is None:
        why = f"{facts.record.scheduler} executor: no accounting"
    else:
        why = "sacct holds no row of this run's jobs"
    note = (
        f"{why}: wall time, GPU-hours and CPU-hours are estimates from the run's own files "
        "(submitted at to its last metrics line, the recipe's allocation)"
    )
    times = [m["time"] for m in facts.metrics if is_number(m.get("time"))]
    if not times:
        return [], LOCAL, note
    job, record = facts.job, facts.record
    nodes = record.nodes + record.spare_nodes
    gpus = (nodes * job.recipe.resources.gpus_per_node) if job and job.profile.accelerator == "gpu" else 0
    cpus = nodes * job.recipe.tasks_per_node * job.recipe.resources.cpus_per_task if job else 0
    start = min(record.submitted_at, min(times))
    return [Allocation(record.job_id, "", start, max(times), gpus, cpus, None)], LOCAL, note


def _throughput(metrics: list[dict[str, Any]]) -> tuple[Figure, Figure]:
    """The median of the logged steps' rates (the first log of each launch is its warm-up)."""
    logs, warm = [], True
    for line in metrics:
        if line.get("event") == "start":
            warm = True
        elif line.get("event") == "log":
            if not warm:
                logs.append(line)
            warm = False
    source = "metrics.jsonl (median of the logged steps after each start's first)"
    figures = []
    for key, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        values = [line[key] for line in logs if is_number(line.get(key))]
        figures.append(
            Figure(statistics.median(values), unit, source)
            if values
            else Figure.missing(unit, f"no {unit} in metrics.jsonl (needs two logged steps in one launch)")
        )
    return figures[0], figures[1]


def _mfu(facts: RunFacts, tokens: Figure) -> Figure:
    """Model FLOPs utilisation: 6 x parameters x tokens/s over the training GPUs' bf16 peak."""
    job = facts.job
    if job is None:
        return Figure.missing("%", facts.problems.get("job.json", "no job.json"))
    if job.profile.accelerator != "gpu":
        return Figure.missing("%", "a CPU run: no GPU peak")
    peak = job.profile.gpu.peak_tflops if job.profile.gpu else None
    if not peak:
        return Figure.missing("%", f"cluster profile {job.profile.name!r} gives no gpu.peak_tflops")
    if facts.model_params is None:
        return Figure.missing("%", facts.problems.get("model", "the model's parameter count is unknown"))
    if tokens.value is None:
        return Figure.missing("%", tokens.why or "no tokens/s")
    flops = TRAINING_FLOPS_PER_PARAM * facts.model_params * tokens.value
    return Figure(
        100 * flops / (_training_gpus(job) * peak * 1e12),
        "%",
        "tokens/s (metrics.jsonl) x 6 x parameters (the planner's model size) / GPUs x gpu.peak_tflops (job.json)",
    )


def _scaling(facts: RunFacts, samples: Figure) -> tuple[Figure, Figure]:
    """The bench table's scaling efficiency at this run's GPU count, and this run's samples/s as a
    share of the bench's there; the newest table that has this scale."""
    gpus = _training_gpus(facts.job) or facts.record.nodes * facts.record.ranks_per_node
    for table in facts.bench:
        scale = next((s for s in table.scales if s.get("gpus") == gpus and is_number(s.get("samples_per_s"))), None)
        if scale is None:
            continue
        efficiency = (
            Figure(scale["efficiency_pct"], "%", table.path)
            if is_number(scale.get("efficiency_pct"))
            else Figure.missing("%", f"{table.path}: no efficiency at {gpus} GPUs")
        )
        if samples.value is None:
            return efficiency, Figure.missing("%", samples.why or "no samples/s")
        return efficiency, Figure(100 * samples.value / scale["samples_per_s"], "%", f"metrics.jsonl / {table.path}")
    why = f"no clusterkit bench table with {gpus} GPUs beside the run (clusterkit bench writes <runs>/<name>/bench-*/)"
    return Figure.missing("%", why), Figure.missing("%", why)


@dataclass(frozen=True)
class SweepReport:
    """A job array's (a sweep's) report: one per task, and the totals."""

    job_id: str
    name: str
    points: list[tuple[int, dict[str, Any], Report]]
    gpu_hours: Figure
    cpu_hours: Figure
    shares: list[Share]


def sweep_report(array: RunRecord, points: Sequence[tuple[int, dict[str, Any], Report]]) -> SweepReport:
    def total(name: str, unit: str) -> Figure:
        figures = [getattr(report, name) for _, _, report in points]
        known = [f.value for f in figures if f.value is not None]
        sources = sorted({f.source for f in figures if f.value is not None})
        missing = len(figures) - len(known)
        return Figure(
            sum(known) if known else None,
            unit,
            ", ".join(sources),
            f"{missing} of {len(figures)} points have none" if missing else None,
        )

    shares = [
        Share(
            bucket,
            sum(s.seconds for _, _, r in points for s in r.shares if s.bucket == bucket),
            sum(s.gpu_hours for _, _, r in points for s in r.shares if s.bucket == bucket),
            sum(s.cpu_hours for _, _, r in points for s in r.shares if s.bucket == bucket),
        )
        for bucket in BUCKETS
    ]
    return SweepReport(
        array.job_id, array.name, list(points), total("gpu_hours", "GPU-h"), total("cpu_hours", "CPU-h"), shares
    )

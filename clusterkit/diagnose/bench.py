"""``clusterkit bench``: the same recipe at several scales, and how well it scales (samples/s, speedup, scaling efficiency).

Every scale keeps the per-GPU work (micro batch and gradient accumulation; the global batch grows
with the GPUs: weak scaling) and runs ``--steps`` steps. Throughput is measured from the runner's
metrics after the warm-up steps: samples between the first and last logged step after warm-up,
over the time between them. Speedup is over the smallest scale; efficiency = speedup / (GPUs /
smallest GPUs). On SLURM the scales go in as dependent jobs (each starts after the previous ended,
so they never share nodes or disturb each other's timing); a job array cannot hold them, since its
tasks share one resource request and the scales differ in node count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from clusterkit.errors import UsageError
from clusterkit.launch.prepare import SubmitOptions, prepare
from clusterkit.load.loader import Override
from clusterkit.runs.logs import METRICS_LIMIT, read_run_file
from clusterkit.runs.poll import poll
from clusterkit.runs.record import RunRecord, metric_records
from clusterkit.runs.status import JobStatus
from clusterkit.schedulers.api import schedule, statuses
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.layout import JOB_JSON, METRICS
from clusterkit.spec.resolved import decode_job_file


@dataclass(frozen=True)
class Scale:
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def overrides(self, steps: int, micro_batch: int, accumulation: int) -> list[Override]:
        """This scale, with the base recipe's per-GPU work (weak scaling)."""
        return [
            Override(("resources", "nodes"), self.nodes),
            Override(("resources", "gpus_per_node"), self.gpus_per_node),
            Override(("parallelism", "dp"), "auto"),
            Override(("parallelism", "global_batch_size"), None),
            Override(("parallelism", "micro_batch_size"), micro_batch),
            Override(("parallelism", "gradient_accumulation_steps"), accumulation),
            Override(("task", "trainer", "args", "max_steps"), steps),
            Override(("task", "trainer", "args", "logging_steps"), 1),
            # No checkpoint inside the timed steps.
            Override(("task", "trainer", "args", "save_steps"), steps * 10),
        ]


@dataclass(frozen=True)
class ScaleResult:
    nodes: int
    gpus_per_node: int
    gpus: int
    job_id: str
    run_dir: str
    state: str
    samples_per_s: float | None
    steps_measured: int
    speedup: float | None = None
    efficiency_pct: float | None = None
    # Not measurable from the built-in runner: DDP overlaps its all-reduces with the backward pass.
    comm_share_pct: float | None = None


def measured_throughput(metrics: list[dict[str, Any]], global_batch: int, warmup: int) -> tuple[float | None, int]:
    """Samples/s over the logged steps after ``warmup`` steps, and how many steps that covers."""
    logged = [m for m in metrics if m.get("event") == "log" and m.get("step", 0) >= warmup]
    if len(logged) < 2:
        return None, 0
    first, last = logged[0], logged[-1]
    steps = last["step"] - first["step"]
    seconds = last["time"] - first["time"]
    return (steps * global_batch / seconds if seconds > 0 and steps > 0 else None), steps


def with_scaling(results: list[ScaleResult]) -> list[ScaleResult]:
    """Speedup and efficiency against the smallest scale that produced a number."""
    measured = [r for r in results if r.samples_per_s]
    if not measured:
        return results
    base = min(measured, key=lambda r: r.gpus)
    assert base.samples_per_s is not None
    scaled = []
    for result in results:
        if not result.samples_per_s:
            scaled.append(result)
            continue
        speedup = result.samples_per_s / base.samples_per_s
        scaled.append(
            ScaleResult(
                **{**asdict(result), "speedup": speedup, "efficiency_pct": 100 * speedup / (result.gpus / base.gpus)}
            )
        )
    return scaled


def read_result(scale: Scale, record: RunRecord, state: str, warmup: int) -> ScaleResult:
    """The scale's throughput; none when the job left no metrics or no job.json (it failed early)."""
    try:
        metrics = metric_records(
            read_run_file(record.path / METRICS, METRICS_LIMIT, "the run's metrics").decode("utf-8", "replace")
        )
        job_file = read_bounded(record.path / JOB_JSON, CONFIG_LIMIT, "a job file")
        global_batch = decode_job_file(job_file).recipe.parallelism.global_batch_size
        samples_per_s, steps = measured_throughput(metrics, global_batch, warmup)
    except (OSError, ValueError, KeyError, TypeError, InputFileError):  # msgspec's decode errors are ValueErrors
        samples_per_s, steps = None, 0
    return ScaleResult(
        scale.nodes, scale.gpus_per_node, scale.gpus, record.job_id, record.run_dir, state, samples_per_s, steps
    )


def wait_all(
    records: list[RunRecord],
    statuses: Callable[[list[RunRecord]], list[JobStatus]],
    report: Callable[[str], None] = print,
) -> dict[str, str]:
    """Final state of every job, reporting each as it ends: one ``statuses`` call per poll for all
    the jobs still running, polled as :mod:`clusterkit.runs.poll` says."""
    ended: dict[str, str] = {}

    def ask() -> dict[str, str]:
        waiting = [record for record in records if record.job_id not in ended]
        states = {}
        for record, status in zip(waiting, statuses(waiting)):
            states[record.job_id] = status.state
            if status.done:
                ended[record.job_id] = status.state
                report(f"  job {record.job_id} ({record.nodes}x{record.ranks_per_node}) {status.state}")
        return {**states, **ended}

    for _ in poll(ask, lambda _: len(ended) == len(records)):
        pass
    return ended


def table_rows(results: list[ScaleResult]) -> list[tuple[str, ...]]:
    def number(value: float | None, pattern: str) -> str:
        return pattern.format(value) if value is not None else "n/a"

    return [
        (
            str(r.gpus),
            f"{r.nodes} x {r.gpus_per_node}",
            number(r.samples_per_s, "{:.1f}"),
            number(r.speedup, "{:.2f}x"),
            number(r.efficiency_pct, "{:.0f}%"),
            number(r.comm_share_pct, "{:.0f}%"),
            r.state,
        )
        for r in results
    ]


def write_outputs(results: list[ScaleResult], out_dir: Path, meta: dict[str, Any]) -> list[Path]:
    """bench.json always; bench.png when matplotlib is installed (the [bench] extra)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    json_path.write_text(json.dumps({**meta, "scales": [asdict(r) for r in results]}, indent=2) + "\n")
    written = [json_path]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    measured = [r for r in results if r.samples_per_s]
    if not measured:
        return written
    base = min(measured, key=lambda r: r.gpus)
    assert base.samples_per_s is not None
    gpus = [r.gpus for r in measured]
    figure, (throughput, efficiency) = plt.subplots(1, 2, figsize=(10, 4))
    throughput.plot(gpus, [r.samples_per_s for r in measured], "o-", label="measured")
    throughput.plot(
        gpus, [base.samples_per_s * g / base.gpus for g in gpus], "--", color="gray", label="ideal (linear)"
    )
    throughput.set(xlabel="GPUs (ranks)", ylabel="samples/s", title=f"{meta['name']}: throughput")
    throughput.legend()
    efficiency.plot(gpus, [r.efficiency_pct for r in measured], "o-")
    efficiency.axhline(100, linestyle="--", color="gray", label="ideal")
    efficiency.set(xlabel="GPUs (ranks)", ylabel="scaling efficiency %", ylim=(0, 110), title="efficiency")
    efficiency.legend()
    for axes in (throughput, efficiency):
        axes.set_xticks(gpus)
    figure.tight_layout()
    png_path = out_dir / "bench.png"
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return [*written, png_path]


@dataclass(frozen=True)
class Submitted:
    scales: list[Scale]
    records: list[RunRecord]
    states: dict[str, str]  # job id -> final state
    how: str  # how the scales were submitted, for the report
    recipe_path: Path  # the recipe as given


def run_scales(
    options: SubmitOptions,
    nodes: list[int],
    gpus_per_node: list[int] | None,
    steps: int,
    report: Callable[[str], None] = print,
) -> Submitted:
    """Submit the recipe once per scale (smallest first), wait for every job and return them."""
    base = prepare(options, one_job="bench").loaded
    if base.recipe.task.trainer is None:
        raise UsageError(f"{base.path}: bench measures the built-in runner's metrics; this recipe runs task.script")
    p = base.recipe.parallelism
    scales = sorted(
        (Scale(n, g) for g in (gpus_per_node or [base.recipe.resources.gpus_per_node]) for n in nodes),
        key=lambda scale: scale.gpus,
    )
    records: list[RunRecord] = []
    states: dict[str, str] = {}
    for scale in scales:
        extra = scale.overrides(steps, p.micro_batch_size, p.gradient_accumulation_steps)
        if records and records[-1].scheduler == "slurm":
            extra.append(Override(("resources", "extra_sbatch", "dependency"), f"afterany:{records[-1].job_id}"))
        request = prepare(options, extra, one_job="bench").request
        if request.scheduler == "ssh":
            raise UsageError("clusterkit bench runs where sbatch is (or locally), not over SSH")
        records.append(schedule(request))
        if request.scheduler == "local":  # no queue to order them: one after another
            states.update(wait_all(records[-1:], statuses, report=report))
    how = (
        "as dependent jobs (each after the previous ends: afterany), not a job array, whose tasks would "
        "share one node count"
        if records[0].scheduler == "slurm"
        else "one after another (local executor)"
    )
    report(f"submitted {len(scales)} scales {how}: jobs {', '.join(r.job_id for r in records)}")
    states.update(wait_all([r for r in records if r.job_id not in states], statuses, report=report))
    return Submitted(scales, records, states, how, base.path)

"""Part 2, the planner against real memory: `clusterkit plan`'s per-GPU estimate for each recipe that
ran, next to its peak torch.cuda.max_memory_allocated. The ablation rows give the layouts without and
with gradient checkpointing (at the row batch and at the largest batch `plan` says fits) and FSDP2
gives ZeRO-3's; this part adds ZeRO-2 with the optimizer offloaded to the CPU, where DeepSpeed is
installed (carried as a wheel on the device machine)."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

from bench.gpu.context import Context
from bench.gpu.procs import MEMORY_KEYS, train_rank
from bench.gpu.recipes import load, plan_memory, run_dir_for, trainer_recipe

TOLERANCE = 0.10  # the bar: the estimate within 10% of the measured peak
# torch's AdamW on the host instead of JIT-compiling DeepSpeedCPUAdam (a minute of the budget); the
# GPU holds the same bytes either way (the optimizer states are on the host).
TORCH_HOST_ADAM = {"config": {"zero_force_ds_cpu_optimizer": False}}


def run(ctx: Context, part: dict[str, Any], budget_s: float) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        part["offload"] = {
            "status": "skipped",
            "why": "deepspeed is not installed (carry its wheel: bench/gpu/README.md)",
        }
    else:
        part["offload"] = offload_run(ctx, budget_s)
    ctx.save()
    part["comparison"] = compare(ctx.results.data)
    ctx.save()
    if part["offload"].get("status") == "failed":
        raise RuntimeError(f"ZeRO-2 offload run: {part['offload']['why']}")


def offload_run(ctx: Context, timeout_s: float) -> dict[str, Any]:
    # Two steps: the GPU's peak is reached in the first (pinning the host states takes most of the time).
    recipe = trainer_recipe(
        "zero2-offload",
        ctx.profile,
        ctx.sizes.model,
        ctx.sizes.seq_len,
        ctx.sizes.micro_batch,
        1,
        2,
        parallelism={"zero_stage": 2, "offload_optimizer": "cpu"},
        deepspeed=TORCH_HOST_ADAM,
    )
    loaded = load(ctx.work, recipe)
    found: dict[str, Any] = {"estimate": plan_memory(loaded), "micro_batch": ctx.sizes.micro_batch, "accumulation": 1}
    run_dir = run_dir_for(ctx.work, loaded)
    outcome, rank = train_rank(ctx.repo, run_dir, timeout_s, "offload")
    found.update(seconds=round(outcome.seconds, 1), memory={k: rank.get(k) for k in MEMORY_KEYS})
    found["status"] = "ok" if outcome.ok else "failed"
    if not outcome.ok:
        found["why"] = rank.get("error") or outcome.why()
    shutil.rmtree(run_dir, ignore_errors=True)
    return found


def compare(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per recipe that ran with a measured peak: estimate, measured, estimate/measured."""
    runs: list[tuple[str, dict[str, Any], Any]] = []
    for key, row in data.get("parts", {}).get("ablation", {}).get("rows", {}).items():
        missed = row.get("oom_at_plan_batch")
        if missed and missed.get("estimate"):  # its peak is a lower bound: the allocation that failed is not in it
            runs.append(
                (
                    f"ablation {key}, out of memory",
                    missed["estimate"],
                    (missed.get("memory") or {}).get("peak_allocated"),
                )
            )
        if row.get("estimate"):
            runs.append((f"ablation {key}", row["estimate"], (row.get("memory") or {}).get("peak_allocated")))
    fsdp_run = data.get("parts", {}).get("fsdp", {}).get("train") or {}
    if fsdp_run.get("estimate"):
        runs.append(("fsdp2 (small model)", fsdp_run["estimate"], fsdp_run.get("peak_allocated")))
    offload = data.get("parts", {}).get("planner", {}).get("offload") or {}
    if offload.get("estimate"):
        runs.append(("zero2 offload", offload["estimate"], (offload.get("memory") or {}).get("peak_allocated")))
    lines = []
    for name, estimate, measured in runs:
        ratio = estimate["total"] / measured if measured else None
        # Without the overhead terms (CUDA context, NCCL buffers, 10% fragmentation), which
        # max_memory_allocated does not count: the tensors alone.
        tensors = estimate["total"] - estimate["overhead"]
        lines.append(
            {
                "run": name,
                "layout": estimate["layout"],
                "estimate": estimate["total"],
                "estimate_tensors": tensors,
                "measured_peak_allocated": measured,
                "ratio": ratio,
                "tensors_ratio": tensors / measured if measured else None,
                "within_10pct": False
                if name.endswith("out of memory")
                else None
                if ratio is None
                else abs(ratio - 1) <= TOLERANCE,
            }
        )
    return lines

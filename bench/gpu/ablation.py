"""Part 1, seed 004's techniques one after another on a ~1B Llama: each row a recipe the built-in
runner trains for a few steps after warm-up, timed from the runner's own metrics.jsonl (one line per
step), with tokens/s, MFU (6·N·tokens/s over the GPU's bf16 peak) and the peak of
torch.cuda.max_memory_allocated next to `clusterkit plan`'s estimate for the same recipe."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from bench.gpu.context import Context
from bench.gpu.procs import MEMORY_KEYS, train_rank
from bench.gpu.recipes import load, plan_memory, run_dir_for, trainer_recipe

# The planner's own limit (plan.planner.MAX_MICRO_BATCH); the largest micro batch a row may get.
MICRO_BATCH_CANDIDATES = (64, 56, 48, 40, 32, 28, 24, 20, 16, 12, 8, 6, 4, 3, 2, 1)
PLAIN_ADAMW = {"optim": "adamw_torch"}
NO_TF32 = {"tf32": False}


@dataclass(frozen=True)
class Row:
    key: str
    label: str  # what the row is, cumulative from the first
    precision: str
    attention: str | None  # None: the runner's default (SDPA; FlashAttention-2 where installed)
    args: dict[str, Any] = field(default_factory=dict)  # task.trainer.args beyond the step counts
    max_batch: bool = False  # the largest micro batch `plan` says fits, accumulation 1
    compile: bool = False
    profile: bool = False  # one optimizer step under torch.profiler after the measured ones


CKPT = {"gradient_checkpointing": True}
COMPILE = {"torch_compile": True}
# In the order of the table (cumulative, as seed 004 adds them); rows not named "defaults" in `label`
# differ from clusterkit's defaults by what their args turn off.
ROWS = (
    Row("fp32", "naive: fp32, eager attention, no TF32, AdamW (foreach)", "fp32", "eager", {**NO_TF32, **PLAIN_ADAMW}),
    Row("bf16", "+ bf16", "bf16", "eager", {**NO_TF32, **PLAIN_ADAMW}),
    Row("tf32", "+ TF32", "bf16", "eager", dict(PLAIN_ADAMW)),
    Row("fused", "+ fused AdamW", "bf16", "eager"),
    Row("sdpa", "+ SDPA/Flash = clusterkit defaults", "bf16", None, profile=True),
    Row("compile", "+ torch.compile", "bf16", None, dict(COMPILE), compile=True),
    Row("compile_ckpt", "+ gradient checkpointing", "bf16", None, {**COMPILE, **CKPT}, compile=True),
    Row(
        "compile_ckpt_max",
        "+ gradient checkpointing, the batch it fits",
        "bf16",
        None,
        {**COMPILE, **CKPT},
        max_batch=True,
        compile=True,
    ),
    Row("defaults_ckpt", "defaults + gradient checkpointing (no compile)", "bf16", None, dict(CKPT)),
    Row(
        "defaults_ckpt_max",
        "defaults + gradient checkpointing, the batch it fits",
        "bf16",
        None,
        dict(CKPT),
        max_batch=True,
    ),
    Row(
        "defaults_max",
        "defaults, the largest batch that fits without checkpointing",
        "bf16",
        None,
        {"gradient_checkpointing": False},
        max_batch=True,
    ),
)
# What runs first when time is short: the defaults and what they are compared with; the memory
# layouts the planner is checked on (checkpointing at the batch it fits, and the largest batch
# without); torch.compile (opt-in, and its warm-up is long); last, checkpointing at the rows' batch.
RUN_ORDER = (
    "fp32",
    "bf16",
    "tf32",
    "fused",
    "sdpa",
    "defaults_ckpt_max",
    "defaults_max",
    "compile",
    "compile_ckpt_max",
    "defaults_ckpt",
    "compile_ckpt",
)
BY_KEY = {row.key: row for row in ROWS}
NEEDED_S = {False: 30.0, True: 90.0}  # a row starts only with this much of the part's time left (compile: True)


def run(ctx: Context, part: dict[str, Any], budget_s: float) -> None:
    deadline = ctx.clock() + budget_s
    rows: dict[str, Any] = part.setdefault("rows", {})
    part["order"] = [row.key for row in ROWS]
    chosen = os.environ.get("BENCH_ROWS")  # a rerun of some rows: BENCH_ROWS=compile,compile_ckpt_max
    for key in [k for k in RUN_ORDER if not chosen or k in chosen.split(",")]:
        row = BY_KEY[key]
        left = deadline - ctx.clock()
        if row.compile and not ctx.sizes.compile_rows:
            rows[key] = {"label": row.label, "status": "skipped", "why": "torch.compile rows are off (BENCH_COMPILE=0)"}
        elif left < NEEDED_S[row.compile]:
            rows[key] = {"label": row.label, "status": "skipped", "why": f"time budget: {left:.0f} s of the part left"}
        else:
            timeout = min(left, ctx.sizes.compile_row_timeout_s if row.compile else ctx.sizes.row_timeout_s)
            rows[key] = measure_row(ctx, row, timeout)
        ctx.save()
    measured = [r for r in rows.values() if r.get("status") == "ok"]
    if not measured:
        raise RuntimeError("no ablation row ran")


def largest_micro_batch(ctx: Context, row: Row) -> int | None:
    """The largest micro batch (accumulation 1) whose `plan` estimate fits the GPU."""
    for micro in MICRO_BATCH_CANDIDATES:
        estimate = plan_memory(load(ctx.work, _recipe(ctx, row, micro, 1, max_steps=1)))
        if estimate["total"] <= estimate["gpu_memory"]:
            return micro
    return None


def _recipe(ctx: Context, row: Row, micro: int, accumulation: int, max_steps: int) -> dict[str, Any]:
    return trainer_recipe(
        f"abl-{row.key.replace('_', '-')}",
        ctx.profile,
        ctx.sizes.model,
        ctx.sizes.seq_len,
        micro,
        accumulation,
        max_steps,
        precision=row.precision,
        attention=row.attention,
        args=row.args,
    )


def measure_row(ctx: Context, row: Row, timeout_s: float) -> dict[str, Any]:
    deadline = ctx.clock() + timeout_s
    micro, accumulation = ctx.sizes.micro_batch, ctx.sizes.accumulation
    if row.max_batch:
        found = largest_micro_batch(ctx, row)
        if found is None:
            return {"label": row.label, "status": "failed", "why": "plan says not even micro batch 1 fits"}
        micro, accumulation = found, 1
    result = attempt(ctx, row, micro, accumulation, timeout_s)
    # The batch `plan` chose did not fit: once more at half of it, so that the row still says what fits.
    if row.max_batch and result["status"] == "oom" and micro > 1 and deadline - ctx.clock() >= NEEDED_S[row.compile]:
        missed = {key: result.get(key) for key in ("micro_batch", "estimate", "memory", "why")}
        result = {**attempt(ctx, row, micro // 2, 1, deadline - ctx.clock()), "oom_at_plan_batch": missed}
    return result


def attempt(ctx: Context, row: Row, micro: int, accumulation: int, timeout_s: float) -> dict[str, Any]:
    """One run of the row's recipe: its throughput, its peak memory and `plan`'s estimate of it."""
    sizes = ctx.sizes
    warmup = sizes.warmup_steps + (1 if row.compile else 0)
    measured = sizes.measured_steps(micro * accumulation)
    max_steps = warmup + measured + (2 if row.profile else 0)
    loaded = load(ctx.work, _recipe(ctx, row, micro, accumulation, max_steps))
    trainer = loaded.recipe.task.trainer
    result: dict[str, Any] = {
        "label": row.label,
        "micro_batch": micro,
        "accumulation": accumulation,
        "warmup_steps": warmup,
        "measured_steps": measured,
        "precision": loaded.recipe.precision,
        "attention": trainer.model.attention,
        "resolved_args": trainer.args,
        "estimate": plan_memory(loaded),
        "warnings": [str(w) for w in loaded.warnings],
    }
    run_dir = run_dir_for(ctx.work, loaded)
    env = dict(
        os.environ,
        **({"BENCH_PROFILE_STEP": str(warmup + measured)} if row.profile else {}),
        **({"TORCH_LOGS": "recompiles"} if row.compile else {}),
    )  # the log says why a measured step recompiled
    outcome, rank = train_rank(ctx.repo, run_dir, timeout_s, row.key, env)
    result["seconds"] = round(outcome.seconds, 1)
    result["memory"] = {k: rank.get(k) for k in MEMORY_KEYS}
    if "profile" in rank:
        result["profile"] = rank["profile"]
    tokens_per_step = micro * accumulation * sizes.seq_len
    result.update(throughput(ctx.metrics(run_dir), warmup, measured, tokens_per_step))
    result["mfu"] = ctx.mfu(result.get("tokens_per_s"))
    if outcome.ok and result.get("tokens_per_s"):
        result["status"] = "ok"
    else:
        oom = "OutOfMemoryError" in str(rank.get("error", "")) or any("out of memory" in line for line in outcome.tail)
        result.update(status="oom" if oom else "failed", why=rank.get("error") or outcome.why())
    shutil.rmtree(run_dir, ignore_errors=True)  # a 1B model's final save is 4 GiB of /dev/shm
    return result


def throughput(records: list[dict[str, Any]], warmup: int, measured: int, tokens_per_step: int) -> dict[str, Any]:
    """Tokens/s between the log lines of step ``warmup`` and step ``warmup + measured`` (each log line
    is written after its step's loss was read, so the GPU had finished the step)."""
    times = {r["step"]: r["time"] for r in records if r.get("event") == "log" and "step" in r and "time" in r}
    start, end = warmup, warmup + measured
    steps = [round(times[s] - times[s - 1], 4) for s in range(start + 1, end + 1) if s in times and s - 1 in times]
    if start not in times or end not in times or times[end] <= times[start]:
        return {"tokens_per_s": None, "step_s": steps, "logged_steps": sorted(times)}
    return {"tokens_per_s": measured * tokens_per_step / (times[end] - times[start]), "step_s": steps}

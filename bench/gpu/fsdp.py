"""Part 3, FSDP2 on one GPU (world 1): the built-in runner with parallelism.fsdp trains, its layout
check finds sharded DTensors (rank record ``fsdp_sharded``), checkpoints are saved, and a second run
with resume_from continues from the newest one. On CPU (the rehearsal) validate refuses FSDP2, as
it should: the refusal is recorded and the same runs go without it, so every other step runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.gpu.context import Context
from bench.gpu.procs import read_json, train_rank
from bench.gpu.recipes import load, plan_memory, run_dir_for, trainer_recipe

FSDP: dict[str, Any] = {}  # as a user writes it: every default (wrap the model's own _no_split_modules)
FIRST_STEPS, SAVE_EVERY, RESUMED_STEPS = 4, 2, 6


def run(ctx: Context, part: dict[str, Any], budget_s: float) -> None:
    from clusterkit.errors import RecipeError

    deadline = ctx.clock() + budget_s
    parallelism: dict[str, Any] = {"fsdp": FSDP}
    if ctx.sizes.mode != "gpu":
        try:
            load(ctx.work, _recipe(ctx, "fsdp-refused", parallelism, FIRST_STEPS))
            part["cpu_refusal"] = None
        except RecipeError as exc:
            part["cpu_refusal"] = str(exc)
        parallelism = {}
    checks: dict[str, bool] = {}
    first = _train(ctx, _recipe(ctx, "fsdp-train", parallelism, FIRST_STEPS), deadline, "fsdp-train")
    part["train"] = first
    ctx.save()
    checks["trained"] = first.get("global_step") == FIRST_STEPS
    checks["sharded"] = bool(first.get("fsdp_sharded")) if parallelism else None  # type: ignore[assignment]
    checkpoints = sorted(p.name for p in Path(first["run_dir"], "checkpoints").glob("checkpoint-*"))
    part["checkpoints"] = checkpoints
    checks["saved"] = f"checkpoint-{FIRST_STEPS}" in checkpoints
    resumed = _train(
        ctx,
        _recipe(ctx, "fsdp-resume", parallelism, RESUMED_STEPS, resume_from=first["run_dir"]),
        deadline,
        "fsdp-resume",
    )
    part["resume"] = resumed
    checks["resumed"] = (
        str(resumed.get("resumed_from") or "").endswith(f"checkpoint-{FIRST_STEPS}")
        and resumed.get("global_step") == RESUMED_STEPS
    )
    part["checks"] = checks
    failed = [name for name, ok in checks.items() if ok is False]
    if failed:
        raise RuntimeError(
            f"FSDP2 smoke: {', '.join(failed)} did not hold "
            f"({first.get('why') or resumed.get('why') or 'see parts.fsdp'})"
        )


def _recipe(ctx: Context, name: str, parallelism: dict[str, Any], steps: int, **top: Any) -> dict[str, Any]:
    return trainer_recipe(
        name,
        ctx.profile,
        ctx.sizes.small_model,
        ctx.sizes.small_seq_len,
        2,
        1,
        steps,
        args={"save_steps": SAVE_EVERY},
        parallelism=parallelism,
        **top,
    )


def _train(ctx: Context, recipe: dict[str, Any], deadline: float, label: str) -> dict[str, Any]:
    from clusterkit.spec.layout import rank_record

    loaded = load(ctx.work, recipe)
    run_dir = run_dir_for(ctx.work, loaded)
    outcome, rank = train_rank(ctx.repo, run_dir, max(10.0, deadline - ctx.clock()), label)
    record = read_json(run_dir / rank_record(0)) or {}
    found = {
        "run_dir": str(run_dir),
        "exit": outcome.returncode,
        "seconds": round(outcome.seconds, 1),
        **{
            key: record.get(key)
            for key in (
                "global_step",
                "resumed_from",
                "fsdp_sharded",
                "parameter_bytes",
                "world_size",
                "dist_world_size",
            )
        },
        "peak_allocated": rank.get("peak_allocated"),
        "estimate": plan_memory(loaded),
    }
    if not outcome.ok:
        found["why"] = rank.get("error") or outcome.why()
    return found

"""Part 5, the whole job path once on the GPU: `clusterkit submit --executor local` of a small recipe
with the preflight on, so the rendered batch script, env.sh, the preflight and torchrun all run as
on a cluster node, and `status` reads the run back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bench.gpu.context import Context
from bench.gpu.procs import read_json
from bench.gpu.recipes import trainer_recipe

STEPS = 3


def run(ctx: Context, part: dict[str, Any], budget_s: float) -> None:
    import clusterkit
    from clusterkit.errors import WaitTimeout
    from clusterkit.spec.layout import PREFLIGHT_RESULT, rank_record

    recipe = trainer_recipe(
        "e2e-job", ctx.profile, ctx.sizes.small_model, ctx.sizes.small_seq_len, 2, 1, STEPS, preflight=True
    )
    path = ctx.work / "recipes" / "e2e-job.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    started = ctx.clock()
    submitted = clusterkit.submit(path, executor="local")
    part.update(job_id=submitted.job_id, run_dir=submitted.run_dir)
    ctx.save()
    try:
        status = submitted.wait(timeout=max(5.0, budget_s - 5), poll_s=1.0)
    except WaitTimeout as exc:
        submitted.cancel()
        raise RuntimeError(f"the local job did not end in time: {exc}") from None
    run_dir = Path(submitted.run_dir)
    part.update(
        seconds=round(ctx.clock() - started, 1),
        state=status.state,
        exit_code=status.exit_code,
        failure=status.failure,
        preflight=read_json(run_dir / PREFLIGHT_RESULT),
        rank=read_json(run_dir / rank_record(0)),
    )
    rank = part["rank"] or {}
    if status.state != "COMPLETED" or rank.get("global_step") != STEPS:
        logs = submitted.logs()[-2000:]
        part["log_tail"] = logs
        raise RuntimeError(f"the local job ended {status.state} at step {rank.get('global_step')}")
    if not part["preflight"]:
        raise RuntimeError(f"the job ran no preflight ({PREFLIGHT_RESULT} missing)")

"""Part 4, the node: `clusterkit doctor --json` on the real nvidia-smi output, and the preflight's
all-reduce benchmark (NCCL on a GPU) run as a job runs it, on one rank."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.gpu.context import Context
from bench.gpu.procs import read_json, run_logged, torchrun, with_env_script
from bench.gpu.recipes import load, run_dir_for, trainer_recipe


def run(ctx: Context, part: dict[str, Any], budget_s: float) -> None:
    deadline = ctx.clock() + budget_s
    problems = []
    part["doctor"] = doctor(ctx, min(60.0, budget_s / 2))
    if part["doctor"].get("error"):
        problems.append(f"doctor: {part['doctor']['error']}")
    ctx.save()
    part["preflight"] = preflight(ctx, max(10.0, deadline - ctx.clock()))
    if part["preflight"].get("error"):
        problems.append(f"preflight: {part['preflight']['error']}")
    if problems:
        raise RuntimeError("; ".join(problems))


def doctor(ctx: Context, timeout_s: float) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "clusterkit", "doctor", "--json"],
            cwd=ctx.repo,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {timeout_s:.0f} s"}
    print(done.stdout + done.stderr, flush=True)
    try:
        checks = json.loads(done.stdout)
    except ValueError:
        return {"exit": done.returncode, "error": f"not JSON (exit {done.returncode}): {done.stderr.strip()[-300:]}"}
    checks = checks.get("checks", checks) if isinstance(checks, dict) else checks
    counts: dict[str, int] = {}
    for check in checks:
        counts[check["verdict"]] = counts.get(check["verdict"], 0) + 1
    return {"exit": done.returncode, "counts": counts, "checks": checks, "captured": captured(ctx, timeout_s)}


# doctor's own capture of nvidia-smi (the text its rules parse), kept as a fixture for tests/fixtures/doctor/
CAPTURE = (
    "import json; from clusterkit.diagnose.doctor import gather; facts = gather(); "
    "print(json.dumps({'gpu_query': facts.gpu_query, 'topo': facts.topo, 'nvlink': facts.nvlink}))"
)


def captured(ctx: Context, timeout_s: float) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CAPTURE],
            cwd=ctx.repo,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return json.loads(done.stdout)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def preflight(ctx: Context, timeout_s: float) -> dict[str, Any]:
    from clusterkit.spec.layout import PREFLIGHT_RESULT

    recipe = trainer_recipe(
        "preflight",
        ctx.profile,
        ctx.sizes.small_model,
        ctx.sizes.small_seq_len,
        1,
        1,
        1,
        preflight={"enabled": True, "only": True},
    )
    run_dir = run_dir_for(ctx.work, load(ctx.work, recipe))
    outcome = run_logged(
        with_env_script(
            run_dir / "env.sh", torchrun(["-m", "clusterkit.runtime.preflight", str(run_dir / "job.json")])
        ),
        timeout_s,
        "preflight",
        cwd=ctx.repo,
    )
    result = read_json(run_dir / PREFLIGHT_RESULT)
    found: dict[str, Any] = {"exit": outcome.returncode, "seconds": round(outcome.seconds, 1), "result": result}
    expected = "nccl" if ctx.sizes.mode == "gpu" else "gloo"
    if not outcome.ok:
        found["error"] = outcome.why()
    elif not result or result.get("backend") != expected or not result.get("sizes"):
        found["error"] = f"no {expected} all-reduce timings in {PREFLIGHT_RESULT}"
    return found

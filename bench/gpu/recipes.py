"""The recipes the GPU proof runs, written as a user would write them, on a cluster profile made for
this machine: each one is validated, resolved and rendered by clusterkit, and its job.json is what
the built-in runner reads, so what is measured is what a recipe runs."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

PROFILE_NAME = "bench-device"


def write_profile(work: Path, device: dict[str, Any], mode: str) -> Path:
    """A one-node, one-GPU profile for this machine: its GPU's name, memory and bf16 peak."""
    gpu: dict[str, Any] = {"model": device["name"], "memory_gb": round(device["memory_bytes"] / 2**30, 2)}
    if device.get("peak_tflops"):
        gpu["peak_tflops"] = device["peak_tflops"]
    profile = {
        "name": PROFILE_NAME,
        "description": "the machine the GPU proof runs on (bench/gpu)",
        "accelerator": "gpu" if mode == "gpu" else "cpu",
        "gpu": gpu,
        "gpus_per_node": 1,
        "gpu_request": "none",
        "cpus_per_node": len(os.sched_getaffinity(0)),
        "interconnect": "loopback",
        "runs_dir": str(work / "runs"),
        "python": sys.executable,
    }
    path = work / "clusters" / f"{PROFILE_NAME}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def trainer_recipe(
    name: str,
    profile: Path,
    model: dict[str, Any],
    seq_len: int,
    micro: int,
    accumulation: int,
    max_steps: int,
    *,
    precision: str | None = None,
    attention: str | None = None,
    args: dict[str, Any] | None = None,
    parallelism: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A task.trainer recipe on one GPU; ``top``: more top-level keys (preflight, deepspeed, resume_from)."""
    model_spec: dict[str, Any] = {"config": model}
    if attention:
        model_spec["attention"] = attention
    samples = max_steps * micro * accumulation + micro * accumulation
    body: dict[str, Any] = {
        "name": name,
        "cluster": str(profile),
        "resources": {"nodes": 1, "gpus_per_node": 1, "time": "30"},  # minutes
        "parallelism": {"micro_batch_size": micro, "gradient_accumulation_steps": accumulation, **(parallelism or {})},
        "task": {
            "trainer": {
                "model": model_spec,
                "dataset": {"type": "synthetic", "seq_len": seq_len, "num_samples": samples},
                # one log line per step: metrics.jsonl then times every step (the log syncs the GPU)
                "args": {
                    "max_steps": max_steps,
                    "logging_steps": 1,
                    "save_steps": 100_000,
                    "learning_rate": 1e-4,
                    **(args or {}),
                },
            }
        },
        **top,
    }
    if precision:
        body["precision"] = precision
    return body


def load(work: Path, recipe: dict[str, Any]) -> Any:
    """Write the recipe under work/recipes and load it as `clusterkit validate` would (RecipeError if invalid)."""
    import clusterkit

    path = work / "recipes" / f"{recipe['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return clusterkit.load_recipe(path)


def run_dir_for(work: Path, loaded: Any) -> Path:
    """A fresh run directory as the batch script leaves it before the launch: every file `render`
    writes (env.sh, ds_config.json) and job.json (the batch script writes that one at start)."""
    import msgspec

    from clusterkit.render.job import render_job
    from clusterkit.spec.layout import JOB_JSON
    from clusterkit.spec.resolved import JobFile

    run_dir = work / "runs" / loaded.recipe.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for file_name, text in render_job(loaded).files.items():
        (run_dir / file_name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / file_name).write_text(text, encoding="utf-8")
    (run_dir / JOB_JSON).write_bytes(msgspec.json.encode(JobFile(recipe=loaded.recipe, profile=loaded.profile)))
    return run_dir


def plan_memory(loaded: Any) -> dict[str, Any]:
    """`clusterkit plan`'s per-GPU estimate for the recipe's own layout, by component (bytes)."""
    from clusterkit.plan.planner import plan

    result = plan(loaded, top=1)
    memory = result.current_memory
    return {
        "layout": result.current.describe(),
        "params": result.shape.params,
        "weights": memory.weights,
        "gradients": memory.gradients,
        "optimizer": memory.optimizer,
        "activations": memory.activations,
        "overhead": memory.overhead,
        "total": memory.total,
        "gpu_memory": result.gpu_memory,
    }

"""ds_config.json as a pure function of the recipe.

Batch sizes are written as numbers that satisfy DeepSpeed's own assertion
``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp``; the
built-in runner passes the same numbers to TrainingArguments, so the Trainer's consistency check
agrees too.
"""

from __future__ import annotations

from typing import Any

from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.resolved import ResolvedRecipe

# Communication defaults (DeepSpeed's documented values, stated here so the rendered file shows them).
BUCKET_SIZE = 500_000_000  # elements per reduce/all-gather bucket (ZeRO 1-2)
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000  # parameters smaller than this stay unpartitioned
GRADIENT_CLIPPING = 1.0  # equals TrainingArguments.max_grad_norm's default


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def deepspeed_config(recipe: ResolvedRecipe, profile: ClusterProfile) -> dict[str, Any]:
    """The config clusterkit renders, with the recipe's deepspeed.config merged over it."""
    return merge_overrides(base_config(recipe, profile), recipe.deepspeed.config or {})[0]


def overridden_keys(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[str]:
    """The dotted keys whose values the recipe's deepspeed.config adds or changes."""
    return merge_overrides(base_config(recipe, profile), recipe.deepspeed.config or {})[1]


def merge_overrides(
    base: dict[str, Any], overrides: dict[str, Any], prefix: str = ""
) -> tuple[dict[str, Any], list[str]]:
    merged = dict(base)
    changed: list[str] = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key], below = merge_overrides(base[key], value, f"{path}.")
            changed.extend(below)
        elif base.get(key, object()) != value:
            merged[key] = value
            changed.append(path)
    return merged, changed


def base_config(recipe: ResolvedRecipe, profile: ClusterProfile) -> dict[str, Any]:
    p = recipe.parallelism
    # With include/exclude the number of ranks is only known to the launcher: let the Trainer fill
    # the batch sizes from the ranks that remain ("auto").
    subset = recipe.deepspeed.include or recipe.deepspeed.exclude
    config: dict[str, Any] = {
        "train_batch_size": "auto" if subset else p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.gradient_accumulation_steps,
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": recipe.precision == "bf16"},
        "fp16": _fp16(recipe.precision == "fp16"),
        "zero_optimization": _zero(recipe, profile),
        "steps_per_print": 1_000_000,  # the runner logs metrics itself
        "wall_clock_breakdown": False,
    }
    if recipe.task.trainer is not None and p.tp > 1:
        # DeepSpeed AutoTP shards every linear layer over tp ranks of a node; its data parallel size is
        # world / tp. train_batch_size is left for DeepSpeed to derive (micro x accumulation x that
        # size): the Trainer's own check counts every rank as data parallel and would refuse it.
        config["tensor_parallel"] = {"autotp_size": p.tp}
        del config["train_batch_size"]
    if profile.accelerator == "cpu" and p.offload_optimizer != "none":
        # On CPU-only nodes, keep torch's AdamW instead of JIT-compiling DeepSpeedCPUAdam (~55 s);
        # on GPU clusters the compiled optimizer is the fast path and stays.
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _fp16(enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {"enabled": False}
    # Dynamic loss scaling (loss_scale 0) starting at 2^16, as DeepSpeed recommends for fp16.
    return {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 16,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }


def _offload(device: str, profile: ClusterProfile) -> dict[str, Any]:
    if device == "nvme":
        return {"device": "nvme", "nvme_path": profile.nvme_path, "pin_memory": True}
    return {"device": "cpu", "pin_memory": True}


def _zero(recipe: ResolvedRecipe, profile: ClusterProfile) -> dict[str, Any]:
    p = recipe.parallelism
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.zero_stage == 0:
        return zero
    zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=BUCKET_SIZE)
    if p.zero_stage < 3:
        zero.update(allgather_partitions=True, allgather_bucket_size=BUCKET_SIZE, reduce_scatter=True)
    else:
        zero.update(
            stage3_prefetch_bucket_size=STAGE3_PREFETCH_BUCKET_SIZE,
            stage3_param_persistence_threshold=STAGE3_PARAM_PERSISTENCE_THRESHOLD,
            # Without this a ZeRO-3 save holds only shards that from_pretrained cannot load.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if p.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(p.offload_optimizer, profile)
    if p.offload_params != "none":
        zero["offload_param"] = _offload(p.offload_params, profile)
    return zero

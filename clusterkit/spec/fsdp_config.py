"""The built-in runner's FSDP2 settings as a pure function of the recipe: the ``TrainingArguments``
keywords (``fsdp`` and ``fsdp_config``, which transformers turns into accelerate's
``FullyShardedDataParallelPlugin``) and, for HSDP, the sizes of accelerate's ``ParallelismConfig``."""

from __future__ import annotations

from typing import Any

from clusterkit.spec.resolved import ResolvedRecipe


def fsdp_training_arguments(recipe: ResolvedRecipe) -> dict[str, Any]:
    """{} without parallelism.fsdp."""
    fsdp = recipe.parallelism.fsdp
    if fsdp is None:
        return {}
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": fsdp.reshard_after_forward,
        "cpu_offload": fsdp.cpu_offload,
        "activation_checkpointing": fsdp.activation_checkpointing,
        "state_dict_type": "SHARDED_STATE_DICT" if fsdp.state_dict == "sharded" else "FULL_STATE_DICT",
        # Every rank builds the model from the same seed: no rank-0-only loading to broadcast from.
        "cpu_ram_efficient_loading": False,
    }
    if fsdp.auto_wrap:
        config["transformer_layer_cls_to_wrap"] = [fsdp.auto_wrap]
    return {"fsdp": True, "fsdp_config": config}


def hsdp_sizes(recipe: ResolvedRecipe) -> tuple[int, int] | None:
    """(replicas, shard size) when FSDP shards over fewer than all ranks (HSDP), else None."""
    fsdp = recipe.parallelism.fsdp
    if fsdp is None or fsdp.shard_size in (None, recipe.world_size):
        return None
    return recipe.world_size // fsdp.shard_size, fsdp.shard_size

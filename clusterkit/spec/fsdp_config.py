"""The built-in runner's FSDP2 settings as a pure function of the recipe: the ``TrainingArguments``
keywords (``fsdp`` and ``fsdp_config``, which transformers turns into accelerate's
``FullyShardedDataParallelPlugin``) and, for HSDP, the sizes of accelerate's ``ParallelismConfig``."""

from __future__ import annotations

from typing import Any

from clusterkit.spec.network import EnvVar
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


def fsdp_shard_size(recipe: ResolvedRecipe) -> int:
    """The ranks each FSDP shard group spans: parallelism.fsdp.shard_size, default every data-parallel rank."""
    fsdp = recipe.parallelism.fsdp
    return recipe.parallelism.dp if fsdp is None or fsdp.shard_size is None else fsdp.shard_size


def hsdp_sizes(recipe: ResolvedRecipe) -> tuple[int, int] | None:
    """(replicas, shard size) when FSDP shards over fewer than all ranks (HSDP), else None."""
    fsdp = recipe.parallelism.fsdp
    if fsdp is None or fsdp.shard_size in (None, recipe.world_size):
        return None
    return recipe.world_size // fsdp.shard_size, fsdp.shard_size


# A script's parallelism.fsdp, as the environment of every rank (the script applies it, e.g. with
# torch's fully_shard over a (replicate, shard) device mesh): name -> what it holds.
FSDP_ENV = {
    "CLUSTERKIT_FSDP_SHARD_SIZE": "ranks in each shard group (parallelism.fsdp.shard_size; default all dp ranks)",
    "CLUSTERKIT_FSDP_REPLICATE_SIZE": "shard groups that replicate each other (HSDP; 1: full shard)",
    "CLUSTERKIT_FSDP_RESHARD_AFTER_FORWARD": "1 or 0 (reshard_after_forward)",
    "CLUSTERKIT_FSDP_CPU_OFFLOAD": "1 or 0 (cpu_offload)",
    "CLUSTERKIT_FSDP_ACTIVATION_CHECKPOINTING": "1 or 0 (activation_checkpointing)",
    "CLUSTERKIT_FSDP_STATE_DICT": "sharded or full (state_dict)",
    "CLUSTERKIT_FSDP_AUTO_WRAP": "the block class to wrap (auto_wrap); unset: the script's choice",
}


def fsdp_env(recipe: ResolvedRecipe) -> tuple[EnvVar, ...]:
    """() but for a script task with parallelism.fsdp (the built-in runner gets it as TrainingArguments)."""
    fsdp = recipe.parallelism.fsdp
    if fsdp is None or recipe.task.trainer is not None:
        return ()
    dp, shard = recipe.parallelism.dp, fsdp_shard_size(recipe)
    values = {
        "CLUSTERKIT_FSDP_SHARD_SIZE": str(shard),
        "CLUSTERKIT_FSDP_REPLICATE_SIZE": str(dp // shard),
        "CLUSTERKIT_FSDP_RESHARD_AFTER_FORWARD": str(int(fsdp.reshard_after_forward)),
        "CLUSTERKIT_FSDP_CPU_OFFLOAD": str(int(fsdp.cpu_offload)),
        "CLUSTERKIT_FSDP_ACTIVATION_CHECKPOINTING": str(int(fsdp.activation_checkpointing)),
        "CLUSTERKIT_FSDP_STATE_DICT": fsdp.state_dict,
        "CLUSTERKIT_FSDP_AUTO_WRAP": fsdp.auto_wrap,
    }
    return tuple(
        EnvVar(name, value, f"parallelism.fsdp for the script: {FSDP_ENV[name]}")
        for name, value in values.items()
        if value is not None
    )

"""The accelerate config file clusterkit renders for ``launcher: accelerate``: what accelerate would
ask in ``accelerate config``, answered from the resolved recipe. The per-node values (machine rank,
main process address and port) are left to the command line, where the launch plan sets them.

Its ``distributed_type`` follows the layout (:func:`clusterkit.spec.launchers.accelerate_type`): a
script's ZeRO stage and offload as accelerate's DEEPSPEED settings, its ``parallelism.fsdp`` as
accelerate's FSDP2 settings (with HSDP, tp and cp as its ``parallelism_config``)."""

from __future__ import annotations

from typing import Any

from clusterkit.spec.fsdp_config import fsdp_shard_size
from clusterkit.spec.launchers import accelerate_type
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.resolved import ResolvedRecipe

MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
STATE_DICT_TYPES = {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}


def accelerate_config(recipe: ResolvedRecipe, profile: ClusterProfile) -> dict[str, Any]:
    kind = accelerate_type(recipe)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        # MULTI_GPU is accelerate's name for torch.distributed data parallelism; on CPU-only nodes the
        # processes still join one gloo group (accelerate's MULTI_CPU is for mpirun).
        "distributed_type": kind,
        "mixed_precision": MIXED_PRECISION[recipe.precision],
        "num_machines": recipe.resources.nodes,
        "num_processes": recipe.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "gpu_ids": "all",
        "main_training_function": "main",
        "downcast_bf16": "no",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if kind == "DEEPSPEED":
        config["deepspeed_config"] = deepspeed_settings(recipe, profile)
    elif kind == "FSDP":
        config["fsdp_config"] = fsdp_settings(recipe)
        if sizes := parallelism_sizes(recipe):
            config["parallelism_config"] = sizes
    return config


def deepspeed_settings(recipe: ResolvedRecipe, profile: ClusterProfile) -> dict[str, Any]:
    """accelerate's ``deepspeed_config`` block: the ZeRO stage and offload; the batch sizes are left
    to accelerate, which takes them from the script's data loader."""
    p = recipe.parallelism
    settings: dict[str, Any] = {
        "deepspeed_multinode_launcher": "standard",  # torchrun per node, as clusterkit starts it
        "zero_stage": p.zero_stage,
        "offload_optimizer_device": p.offload_optimizer,
        "offload_param_device": p.offload_params,
        "zero3_init_flag": p.zero_stage == 3,
        # as clusterkit's ds_config: a ZeRO-3 run saves a loadable model, not only its shards
        "zero3_save_16bit_model": p.zero_stage == 3,
    }
    if p.offload_optimizer == "nvme":
        settings["offload_optimizer_nvme_path"] = profile.nvme_path
    if p.offload_params == "nvme":
        settings["offload_param_nvme_path"] = profile.nvme_path
    return settings


def fsdp_settings(recipe: ResolvedRecipe) -> dict[str, Any]:
    """accelerate's ``fsdp_config`` block for parallelism.fsdp (FSDP2)."""
    fsdp = recipe.parallelism.fsdp
    assert fsdp is not None
    settings: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": fsdp.reshard_after_forward,
        "fsdp_offload_params": fsdp.cpu_offload,
        "fsdp_activation_checkpointing": fsdp.activation_checkpointing,
        "fsdp_state_dict_type": STATE_DICT_TYPES[fsdp.state_dict],
        # Every rank builds the model from the same seed: no rank-0-only loading to broadcast from.
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    if fsdp.auto_wrap:
        settings["fsdp_transformer_layer_cls_to_wrap"] = fsdp.auto_wrap
    return settings


def parallelism_sizes(recipe: ResolvedRecipe) -> dict[str, int]:
    """accelerate's ``parallelism_config`` where FSDP shards over fewer than the data-parallel ranks
    (HSDP) or tp/cp split each replica; {} for plain full sharding."""
    p = recipe.parallelism
    shard = fsdp_shard_size(recipe)
    if shard == p.dp and p.tp == 1 and p.cp == 1:
        return {}
    return {
        "parallelism_config_dp_replicate_size": p.dp // shard,
        "parallelism_config_dp_shard_size": shard,
        "parallelism_config_tp_size": p.tp,
        "parallelism_config_cp_size": p.cp,
    }

"""The accelerate config file clusterkit renders for ``launcher: accelerate``: what accelerate would
ask in ``accelerate config``, answered from the resolved recipe. The per-node values (machine rank,
main process address and port) are left to the command line, where the launch plan sets them."""

from __future__ import annotations

from typing import Any

from clusterkit.spec.resolved import ResolvedRecipe

MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def accelerate_config(recipe: ResolvedRecipe) -> dict[str, Any]:
    return {
        "compute_environment": "LOCAL_MACHINE",
        # MULTI_GPU is accelerate's name for torch.distributed data parallelism; on CPU-only nodes the
        # processes still join one gloo group (accelerate's MULTI_CPU is for mpirun).
        "distributed_type": "MULTI_GPU",
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

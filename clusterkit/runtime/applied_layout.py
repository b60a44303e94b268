"""The parallel layout a rank really runs, read from the model and DeepSpeed's process groups once
the Trainer has prepared them, checked against the recipe before the first step and kept for the
rank's record: a degree the frameworks silently dropped stops the run instead of training wrongly."""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from clusterkit.spec.resolved import ResolvedRecipe


class LayoutMismatch(RuntimeError):
    """The layout that runs is not the recipe's."""


def _tensor_parallel_size() -> int:
    """DeepSpeed AutoTP's group size; 1 where no tensor-parallel group exists."""
    try:
        from deepspeed.utils import groups

        return int(groups.get_tensor_model_parallel_world_size())
    except (ImportError, AssertionError, RuntimeError, ValueError):
        return 1


def _attention_shard(model: torch.nn.Module) -> tuple[str, list[int]] | None:
    """The first attention query projection's weight and its shape on this rank."""
    for name, param in model.named_parameters():
        if name.endswith("q_proj.weight"):
            return name, list(param.shape)
    return None


def _fsdp_sharded(params: list[torch.nn.Parameter]) -> bool:
    """Whether FSDP2 sharded the parameters: DTensors placed as shards, not plain replicated tensors."""
    from torch.distributed.tensor import DTensor, Shard

    return any(isinstance(p, DTensor) and any(isinstance(place, Shard) for place in p.placements) for p in params)


def measure(model: torch.nn.Module, world_size: int) -> dict[str, Any]:
    tp = _tensor_parallel_size()
    shard = _attention_shard(model)
    params = list({id(p): p for p in model.parameters()}.values())
    # A DTensor's own bytes are its local shard's.
    local = [getattr(p, "_local_tensor", p) for p in params]
    return {
        "tp_size": tp,
        "dp_size": world_size // tp,
        "attention_weight": shard[0] if shard else None,
        "attention_shard_shape": shard[1] if shard else None,
        "fsdp_sharded": _fsdp_sharded(params),
        "parameter_bytes": int(sum(t.numel() * t.element_size() for t in local)),
    }


def mismatch(recipe: ResolvedRecipe, facts: dict[str, Any], config: Any, world_size: int | None = None) -> str | None:
    """Why the measured layout is not the recipe's, or None. ``world_size``: the ranks really
    launched, where DeepSpeed include/exclude made them fewer than the recipe's."""
    p = recipe.parallelism
    dp = (world_size or recipe.world_size) // p.tp
    if p.fsdp is not None and not facts["fsdp_sharded"]:
        return "parallelism.fsdp asks for FSDP2, but no parameter is a sharded DTensor (the model runs unsharded)"
    if facts["tp_size"] != p.tp:
        return f"the tensor-parallel group has {facts['tp_size']} ranks, the recipe asks for tp={p.tp}"
    if facts["dp_size"] != dp:
        return f"the data-parallel size is {facts['dp_size']}, the recipe's is dp={dp}"
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "head_dim", None)
    if facts["attention_shard_shape"] and heads:
        full = heads * (head_dim or config.hidden_size // heads)
        if facts["attention_shard_shape"][0] * p.tp != full:
            return (
                f"{facts['attention_weight']} holds {facts['attention_shard_shape'][0]} of {full} output features "
                f"on this rank; with tp={p.tp} it should hold {full // p.tp}"
            )
    return None


class AppliedLayout(TrainerCallback):
    """Measures the layout when training begins (after the Trainer prepared the model) and stops
    the run if it is not the recipe's; ``facts`` go into the rank's record."""

    def __init__(self, recipe: ResolvedRecipe, world_size: int):
        self.recipe = recipe
        self.world_size = world_size
        self.facts: dict[str, Any] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.facts = measure(model, self.world_size)
        why = mismatch(self.recipe, self.facts, model.config, self.world_size)
        if why:
            raise LayoutMismatch(f"clusterkit: the layout that runs is not the recipe's: {why}; not training")

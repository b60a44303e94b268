"""What the built-in Trainer runner applies of a recipe's parallel degrees, and what it refuses:
data parallelism and ZeRO, tensor parallelism through DeepSpeed AutoTP; never a degree ignored."""

from __future__ import annotations

from typing import Any

from clusterkit.load.job_checks import Report
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Recipe

# Model families DeepSpeed's AutoTP cannot shard: deepspeed.module_inject.auto_tp.AutoTP.supported
# (0.19.8). Kept here so validate need not import DeepSpeed; tests/test_autotp.py compares the two.
AUTOTP_UNSUPPORTED = ("deberta", "flaubert", "fsmt", "gpt2", "led", "longformer", "xlm", "xlnet")
# ZeRO stages AutoTP training composes with (DeepSpeed's AutoTP training tutorial: stage 0, 1 or 2).
AUTOTP_ZERO_STAGES = (0, 1, 2)


def check_fsdp(recipe: Recipe, profile: ClusterProfile, world: int, error: Report) -> None:
    """FSDP2 instead of ZeRO: the built-in runner's (GPU profiles), or a script's, which reads the layout
    from CLUSTERKIT_FSDP_* (or gets it from accelerate's FSDP config under launcher: accelerate). On CPU
    accelerate refuses FSDP or silently wraps the model in plain DDP, so the runner and accelerate are
    refused there rather than run as something else; a script applying FSDP2 itself runs on gloo."""
    fsdp, key = recipe.parallelism.fsdp, ("parallelism", "fsdp")
    if fsdp is None:
        return
    p, trainer = recipe.parallelism, recipe.task.trainer is not None
    if profile.accelerator == "cpu" and (trainer or recipe.launcher == "accelerate"):
        error(
            key,
            f"FSDP2 cannot run on CPU (cluster profile {profile.name!r}) under "
            f"{'the built-in runner' if trainer else 'launcher: accelerate'}: accelerate's FSDP needs GPUs and "
            "on CPU falls back to plain DDP; for sharded data parallelism here use zero_stage: 3",
        )
    if p.zero_stage or recipe.launcher == "deepspeed" or recipe.deepspeed.enabled:
        error(key, "FSDP2 replaces DeepSpeed: leave zero_stage at 0 and the launcher torchrun, accelerate or python")
    if trainer and p.tp > 1:
        error(key, "the built-in runner's FSDP2 shards over every rank: leave tp at 1")
    if recipe.launcher == "accelerate" and not trainer:
        for degree, what in (("pp", "pipeline"), ("ep", "expert")):
            if getattr(p, degree) > 1:
                error(
                    ("parallelism", degree),
                    f"accelerate's FSDP config has no {what} parallelism (its parallelism_config: dp, tp, cp); "
                    f"set {degree}: 1, or use launcher: torchrun and apply it in the script",
                )
    # FSDP shards over the data-parallel ranks: the world less tp, pp and cp (all of it for the runner).
    split = p.tp * p.pp * p.cp
    dp = world // split if world % split == 0 else world
    if fsdp.shard_size is not None and (fsdp.shard_size > dp or dp % fsdp.shard_size):
        error(
            key + ("shard_size",),
            f"{fsdp.shard_size} must divide the {dp} data-parallel ranks (the rest are HSDP replicas)",
        )


def check_trainer_parallelism(recipe: Recipe, model_config: dict[str, Any] | None, key: tuple, error: Report) -> None:
    """``key``: where the model's architecture is given (its config), for the errors about it."""
    if recipe.task.trainer is None:
        return
    p = recipe.parallelism
    if p.tp > 1:
        if recipe.deepspeed.enabled is False:
            error(("deepspeed", "enabled"), f"tp={p.tp} trains through DeepSpeed AutoTP; remove enabled: false")
        if p.zero_stage not in AUTOTP_ZERO_STAGES:
            error(
                ("parallelism", "zero_stage"),
                f"DeepSpeed AutoTP trains with ZeRO stage 0, 1 or 2, not {p.zero_stage}: "
                "set zero_stage: 2, or tp: 1 for ZeRO-3",
            )
        model_type = str((model_config or {}).get("model_type", "")).lower()
        if not model_type:
            error(
                key,
                f"tp={p.tp}: the model's architecture must be known here (model.config with model_type, or a "
                "local pretrained model) to check that DeepSpeed AutoTP can shard it",
            )
        elif model_type in AUTOTP_UNSUPPORTED:
            error(
                key,
                f"DeepSpeed AutoTP cannot shard {model_type} models; use tp: 1 (data parallel, ZeRO), or a "
                "model AutoTP supports (Llama, Qwen, Mistral, ...)",
            )
        kv_heads = (model_config or {}).get("num_key_value_heads")
        if isinstance(kv_heads, int) and kv_heads % p.tp:
            error(key, f"the model's {kv_heads} key/value heads are not divisible by tp={p.tp}")
    for degree, what in (("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        if getattr(p, degree) > 1:
            error(
                ("parallelism", degree),
                f"the built-in HF Trainer runner cannot do {what} parallelism (it applies dp, "
                f"ZeRO and tp); use task.script with a framework that does, or set {degree}: 1",
            )

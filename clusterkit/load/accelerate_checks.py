"""``launcher: accelerate`` with a config of your own (``accelerate.config``): clusterkit runs it as
accelerate would, with the layout flags (machines, processes, rank, main process) and the type flag
from the recipe on the command line, which win over the file's. So the file must ask for what the
recipe declares: its ``distributed_type`` the recipe's layout (ZeRO: DEEPSPEED, a script's
parallelism.fsdp: FSDP), and its ZeRO stage, offload and FSDP settings the recipe's. A setting the
file leaves out is accelerate's default, and is compared as that; each contradiction is one error
naming both places."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import yaml

from clusterkit.load.job_checks import Report
from clusterkit.spec.accelerate_config import MIXED_PRECISION, STATE_DICT_TYPES
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.fsdp_config import fsdp_shard_size
from clusterkit.spec.launchers import accelerate_type
from clusterkit.spec.resolved import ResolvedRecipe

KEY = ("accelerate", "config")
# Types that run as clusterkit's MULTI_GPU (the command line's --multi_gpu).
DATA_PARALLEL = ("MULTI_GPU", "MULTI_CPU", "NO")
# accelerate 1.x's defaults for what a config leaves out (DeepSpeedPlugin, FullyShardedDataParallelPlugin).
ZERO_STAGE_DEFAULT = 2
# FSDP1's sharding strategies, in accelerate's order (it also takes their number, 1-5): (shards at
# all, reshards after forward, hybrid).
SHARDING = {
    "FULL_SHARD": (True, True, False),
    "SHARD_GRAD_OP": (True, False, False),
    "NO_SHARD": (False, False, False),
    "HYBRID_SHARD": (True, True, True),
    "HYBRID_SHARD_ZERO2": (True, False, True),
}


def _read(path: str, what: str, parse: Callable[[str], Any], error: Report) -> Any:
    try:
        return parse(read_bounded(path, CONFIG_LIMIT, what).decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, InputFileError) as exc:
        error(KEY, f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}")
        return None


def check_accelerate_config(recipe: ResolvedRecipe, error: Report) -> None:
    path = recipe.accelerate.config
    if path is None:
        return
    config = _read(path, "the accelerate config", yaml.safe_load, error)
    if config is None:
        return
    if not isinstance(config, dict):
        error(KEY, f"{path}: an accelerate config is a mapping of settings")
        return
    kind, expected = str(config.get("distributed_type", "NO")), accelerate_type(recipe)
    if (kind in DATA_PARALLEL and expected == "MULTI_GPU") or kind == expected:
        if kind in ("DEEPSPEED", "FSDP"):  # the sharded engine's dtypes, which the memory estimate counts
            theirs = str(config.get("mixed_precision") or "no").lower()  # None: accelerate's "no"
            _differs(
                error, path, "mixed_precision", theirs, "precision", MIXED_PRECISION[recipe.precision], recipe.precision
            )
        if kind == "DEEPSPEED" and (settings := _block(config, "deepspeed_config", path, error)) is not None:
            _check_deepspeed(recipe, path, settings, error)
        elif kind == "FSDP":
            _check_fsdp(recipe, path, config, error)
        return
    error(KEY, f"{path}: distributed_type {kind} contradicts the recipe's layout ({_layout(recipe, expected)})")


def _layout(recipe: ResolvedRecipe, expected: str) -> str:
    if expected == "DEEPSPEED":
        return f"DEEPSPEED, from parallelism.zero_stage {recipe.parallelism.zero_stage}"
    if expected == "FSDP":
        return "FSDP, from parallelism.fsdp"
    if recipe.task.trainer is not None:
        return "MULTI_GPU: the built-in runner starts DeepSpeed or FSDP itself; use launcher torchrun for it"
    return "MULTI_GPU: set parallelism.zero_stage for DEEPSPEED, parallelism.fsdp for FSDP"


def _block(config: dict, name: str, path: str, error: Report) -> dict | None:
    """The settings under ``name`` ({} where there are none); None, reported, where they are not a mapping."""
    block = config.get(name) or {}
    if not isinstance(block, dict):
        error(KEY, f"{path}: {name} is a mapping of settings")
        return None
    return block


def _differs(
    error: Report, path: str, setting: str, theirs: object, field: str, ours: object, written: object = None
) -> None:
    """``written``: the recipe's value as written, where ``ours`` is its accelerate spelling."""
    if theirs != ours:
        error(KEY, f"{path}: {setting} is {_shown(theirs)}, but {field} is {_shown(written or ours)}")


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_deepspeed(recipe: ResolvedRecipe, path: str, settings: dict, error: Report) -> None:
    p = recipe.parallelism
    file = settings.get("deepspeed_config_file")
    if file is not None:  # its ZeRO settings are in that JSON file (accelerate ignores the block's then)
        where = str(file)
        if not os.path.isabs(where):  # accelerate opens it from the job's working directory
            where = os.path.join(os.getcwd(), where)
        ds = _read(where, "the DeepSpeed config", json.loads, error)
        if not isinstance(ds, dict):
            return
        zero = ds.get("zero_optimization") or {}
        stage = _number(zero.get("stage", 0)) if isinstance(zero, dict) else zero
        offloads = [
            _device(zero.get(name) if isinstance(zero, dict) else None)
            for name in ("offload_optimizer", "offload_param")
        ]
        described = f"{file} (deepspeed_config_file of {path})"
        _differs(error, described, "zero_optimization.stage", stage, "parallelism.zero_stage", p.zero_stage)
        for (name, field), device in zip(
            (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")), offloads
        ):
            _differs(
                error, described, f"zero_optimization.{name}.device", device, f"parallelism.{field}", getattr(p, field)
            )
        return
    stage = _number(settings.get("zero_stage", ZERO_STAGE_DEFAULT))
    _differs(error, path, "deepspeed_config.zero_stage", stage, "parallelism.zero_stage", p.zero_stage)
    for name, field in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        device = str(settings.get(name, "none")).lower()
        _differs(error, path, f"deepspeed_config.{name}", device, f"parallelism.{field}", getattr(p, field))


def _check_fsdp(recipe: ResolvedRecipe, path: str, config: dict, error: Report) -> None:
    fsdp, p = recipe.parallelism.fsdp, recipe.parallelism
    assert fsdp is not None  # the FSDP type is expected only with parallelism.fsdp
    settings, sizes = _block(config, "fsdp_config", path, error), _block(config, "parallelism_config", path, error)
    if settings is None or sizes is None:
        return
    version = _number(settings.get("fsdp_version", 1))
    if version not in (1, 2):
        error(KEY, f"{path}: fsdp_version {_shown(version)} is not one accelerate has (1 or 2)")
        return
    reshard: object = settings.get("fsdp_reshard_after_forward", True)
    hybrid = False
    # FSDP1 names a sharding strategy (newer accelerate also takes it as fsdp_reshard_after_forward).
    strategy = settings.get("fsdp_sharding_strategy", None if isinstance(reshard, bool) else reshard)
    if version == 1 or strategy is not None and str(strategy).upper() in SHARDING or str(strategy).isdigit():
        name = str(strategy or "FULL_SHARD").upper()
        name = list(SHARDING)[int(name) - 1] if name in ("1", "2", "3", "4", "5") else name
        if name not in SHARDING:
            error(
                KEY,
                f"{path}: fsdp_sharding_strategy {_shown(strategy)} is not one accelerate has ({', '.join(SHARDING)})",
            )
            return
        shards, reshard, hybrid = SHARDING[name]
        if not shards:
            error(KEY, f"{path}: fsdp_sharding_strategy {name} does not shard, but parallelism.fsdp is set")
    field = "parallelism.fsdp"
    _differs(
        error,
        path,
        "fsdp_reshard_after_forward",
        _bool(reshard),
        f"{field}.reshard_after_forward",
        fsdp.reshard_after_forward,
    )
    _differs(
        error,
        path,
        "fsdp_offload_params",
        _bool(settings.get("fsdp_offload_params", False)),
        f"{field}.cpu_offload",
        fsdp.cpu_offload,
    )
    _differs(
        error,
        path,
        "fsdp_activation_checkpointing",
        _bool(settings.get("fsdp_activation_checkpointing", False)),
        f"{field}.activation_checkpointing",
        fsdp.activation_checkpointing,
    )
    default_type = "FULL_STATE_DICT" if version == 1 else "SHARDED_STATE_DICT"
    _differs(
        error,
        path,
        "fsdp_state_dict_type",
        str(settings.get("fsdp_state_dict_type", default_type)),
        f"{field}.state_dict",
        STATE_DICT_TYPES[fsdp.state_dict],
        fsdp.state_dict,
    )
    wrap = settings.get("fsdp_transformer_layer_cls_to_wrap")
    if wrap is not None and fsdp.auto_wrap is not None:
        _differs(error, path, "fsdp_transformer_layer_cls_to_wrap", str(wrap), f"{field}.auto_wrap", fsdp.auto_wrap)
    shard = fsdp_shard_size(recipe)
    layout = f"{p.dp // shard} replicas x {shard} shards, tp {p.tp}, cp {p.cp}"
    if not sizes:
        if hybrid or shard != p.dp or p.tp > 1 or p.cp > 1:
            error(KEY, f"{path}: has no parallelism_config, but the recipe's layout is {layout} (parallelism)")
        return
    for name, ours, where in (
        ("dp_shard_size", shard, f"{field}.shard_size"),
        ("dp_replicate_size", p.dp // shard, f"{field}.shard_size (data-parallel ranks / shard size)"),
        ("tp_size", p.tp, "parallelism.tp"),
        ("cp_size", p.cp, "parallelism.cp"),
    ):
        theirs = sizes.get(f"parallelism_config_{name}", 1)
        _differs(error, path, f"parallelism_config_{name}", theirs, where, ours)


def _number(value: object) -> object:
    """A whole number written as text ("3") as the number accelerate reads it; anything else as it is."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _device(offload: object) -> object:
    """An offload block's device ("none" without one)."""
    if offload is None:
        return "none"
    return str(offload.get("device", "none")).lower() if isinstance(offload, dict) else offload


def _bool(value: object) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")

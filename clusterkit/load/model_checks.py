"""The model's config: read where it is known locally (never a hub), and checked: its sizes usable,
the hidden size split into the heads, the sequence within the positions, the heads and layers
against tp and pp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusterkit.errors import Finding, RecipeError
from clusterkit.load.job_checks import Report
from clusterkit.load.yaml_source import KeyPath, SourceMap
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.recipe import Recipe

_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")
# Model-config sizes the checks and the planner compute with: each a positive integer when given.
_SIZE_KEYS = (
    *_HEAD_KEYS,
    *_LAYER_KEYS,
    *_HIDDEN_KEYS,
    *_POSITION_KEYS,
    "vocab_size",
    "intermediate_size",
    "n_inner",
    "num_key_value_heads",
    "head_dim",
)


def read_model_config(recipe: Recipe, source: SourceMap) -> dict[str, Any] | None:
    """The model's config when it is known locally (an inline dict or a config.json path, made
    absolute by :func:`clusterkit.load.paths.resolve_local_paths`); never a hub."""
    trainer = recipe.task.trainer
    if trainer is None:
        return recipe.task.model_config
    if trainer.model.config is None:
        return None
    config = trainer.model.config
    if isinstance(config, dict):
        return config
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    key = ("task", "trainer", "model", "config")
    try:
        loaded = json.loads(read_bounded(path, CONFIG_LIMIT, "a model config"))
    except FileNotFoundError:
        raise RecipeError(Finding(source.locate(key), key, f"model config not found: {path}")) from None
    except (OSError, ValueError, InputFileError) as exc:
        raise RecipeError(Finding(source.locate(key), key, f"cannot read model config {path}: {exc}")) from None
    if not isinstance(loaded, dict):
        raise RecipeError(Finding(source.locate(key), key, f"{path} is not a JSON object"))
    return loaded


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_config_key(recipe: Recipe) -> KeyPath:
    return ("task", "trainer", "model", "config") if recipe.task.trainer else ("task", "model_config")


def check_model_values(recipe: Recipe, config: dict[str, Any], error: Report) -> bool:
    """Sizes are positive integers, the hidden size splits into the heads, the sequence fits the
    positions. False when a size is unusable (the shape checks and estimates then cannot run)."""
    key = model_config_key(recipe)
    usable = True
    for name in _SIZE_KEYS:
        value = config.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            error(key + (name,), f"must be a positive whole number, got {json.dumps(value)}")
            usable = False
    if not isinstance(config.get("model_type", ""), str):
        error(
            key + ("model_type",),
            f"must be a model type name such as gpt2 or llama, got {json.dumps(config['model_type'])}",
        )
        usable = False
    if not usable:
        return False
    heads, hidden = _first_int(config, _HEAD_KEYS), _first_int(config, _HIDDEN_KEYS)
    if heads and hidden and hidden % heads and config.get("head_dim") is None:
        error(key, f"the hidden size {hidden} is not divisible by the {heads} attention heads")
    positions = _first_int(config, _POSITION_KEYS)
    trainer = recipe.task.trainer
    if trainer is not None and positions is not None and trainer.dataset.seq_len > positions:
        error(
            ("task", "trainer", "dataset", "seq_len"),
            f"{trainer.dataset.seq_len} is longer than the model's {positions} positions",
        )
    return True


def check_model_shape(recipe: Recipe, config: dict[str, Any], error: Report, warn: Report) -> None:
    p = recipe.parallelism
    key = model_config_key(recipe)
    heads, layers = _first_int(config, _HEAD_KEYS), _first_int(config, _LAYER_KEYS)
    if heads is not None and heads % p.tp:
        error(key, f"the model's {heads} attention heads are not divisible by tp={p.tp}")
    if layers is not None and layers % p.pp:
        # Uneven first and last stages are common and legitimate (embeddings and head weigh too).
        warn(
            key,
            f"the model's {layers} layers do not divide evenly into pp={p.pp} stages: "
            f"the stages get {layers // p.pp} or {layers // p.pp + 1} layers",
        )

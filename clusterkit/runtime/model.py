"""Model and tokenizer for the built-in runner: from an inline config, a local config.json, or
``from_pretrained`` (a local path, or a hub name for users who have hub access)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterkit.spec.recipe import ModelSpec


def _local(path: str, base_dir: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base_dir / candidate


def build_model(spec: ModelSpec, base_dir: Path) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.pretrained:
        local = _local(spec.pretrained, base_dir)
        return AutoModelForCausalLM.from_pretrained(str(local) if local.exists() else spec.pretrained)
    config = spec.config
    if isinstance(config, dict):
        settings = dict(config)
        model_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    else:
        model_config = AutoConfig.from_pretrained(str(_local(config, base_dir)))
    return AutoModelForCausalLM.from_config(model_config)


def build_tokenizer(spec: ModelSpec, base_dir: Path) -> Any:
    """The tokenizer named by model.tokenizer (or the pretrained model's own); None = byte-level."""
    from transformers import AutoTokenizer

    name = spec.tokenizer or spec.pretrained
    if not name:
        return None
    local = _local(name, base_dir)
    return AutoTokenizer.from_pretrained(str(local) if local.exists() else name)

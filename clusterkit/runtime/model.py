"""Model and tokenizer for the built-in runner: from an inline config, a local config.json, or
``from_pretrained`` (a local path, or a hub name for users who have hub access)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusterkit.spec.recipe import ModelSpec


def _local(path: str, base_dir: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base_dir / candidate


def attention_implementation(on_gpu: bool, flash_installed: bool) -> str | None:
    """The GPU default: fused attention. FlashAttention-2 on a GPU where its package is installed;
    else None, transformers' own choice: PyTorch's SDPA wherever the architecture supports it."""
    return "flash_attention_2" if on_gpu and flash_installed else None


def build_model(spec: ModelSpec, base_dir: Path, attn_implementation: str | None = None) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.pretrained:
        local = _local(spec.pretrained, base_dir)
        return AutoModelForCausalLM.from_pretrained(
            str(local) if local.exists() else spec.pretrained, attn_implementation=attn_implementation
        )
    config = spec.config
    if isinstance(config, dict):
        settings = dict(config)
        model_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    else:
        model_config = AutoConfig.from_pretrained(str(_local(config, base_dir)))
    return AutoModelForCausalLM.from_config(model_config, attn_implementation=attn_implementation)


def build_tokenizer(spec: ModelSpec, base_dir: Path) -> Any:
    """The tokenizer named by model.tokenizer (or the pretrained model's own); None = byte-level."""
    from transformers import AutoTokenizer

    name = spec.tokenizer or spec.pretrained
    if not name:
        return None
    local = _local(name, base_dir)
    return AutoTokenizer.from_pretrained(str(local) if local.exists() else name)

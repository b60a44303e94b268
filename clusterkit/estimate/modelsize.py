"""Model size without weights: exact parameter counts in closed form per architecture family (no
torch, so it runs on a login node), with the meta-device count as the fallback and as the test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterkit.errors import MissingPackage


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    intermediate: int
    # The biggest single module's parameters (ZeRO-3 gathers at least this much at once).
    largest_layer_params: int
    family: str


class UnknownArchitecture(ValueError):
    pass


def _get(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is None:
        raise UnknownArchitecture(f"the model config lacks {keys[0]}")
    return default


def _gpt2(config: dict[str, Any], seq_len: int | None) -> ModelShape:
    d, layers = _get(config, "n_embd", default=768), _get(config, "n_layer", default=12)
    vocab, positions = _get(config, "vocab_size", default=50257), _get(config, "n_positions", default=1024)
    inner = config.get("n_inner") or 4 * d
    # per block: 2 LayerNorms, c_attn (d x 3d + 3d), attn c_proj (d x d + d), c_fc (d x inner + inner), mlp c_proj (inner x d + d)
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d)
    params = vocab * d + positions * d + layers * block + 2 * d  # lm_head is tied to wte
    return ModelShape(
        params,
        layers,
        d,
        _get(config, "n_head", default=12),
        vocab,
        seq_len or positions,
        inner,
        max(vocab * d, d * inner, 3 * d * d),
        "gpt2",
    )


def _llama(config: dict[str, Any], seq_len: int | None) -> ModelShape:
    d, layers = _get(config, "hidden_size", default=4096), _get(config, "num_hidden_layers", default=32)
    heads = _get(config, "num_attention_heads", default=32)
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or d // heads
    inner, vocab = _get(config, "intermediate_size", default=11008), _get(config, "vocab_size", default=32000)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    # Llama's attention_bias puts biases on q, k, v and o; Qwen2 always has them on q, k, v only.
    if config.get("model_type") == "qwen2":
        biases = q_out + 2 * kv_out
    else:
        biases = q_out + 2 * kv_out + d if config.get("attention_bias") else 0
    attention = d * q_out + 2 * d * kv_out + q_out * d + biases
    mlp = 3 * d * inner + (2 * inner + d if config.get("mlp_bias") else 0)
    block = attention + mlp + 2 * d  # two RMSNorms
    tied = bool(config.get("tie_word_embeddings", False))
    params = vocab * d + layers * block + d + (0 if tied else vocab * d)
    return ModelShape(
        params,
        layers,
        d,
        heads,
        vocab,
        seq_len or _get(config, "max_position_embeddings", default=4096),
        inner,
        max(vocab * d, d * inner),
        "llama",
    )


# Llama-shaped decoders (RMSNorm, gated MLP, grouped-query attention) share the closed form.
_FAMILIES = {"gpt2": _gpt2, "llama": _llama, "mistral": _llama, "qwen2": _llama}
CLOSED_FORM_FAMILIES = frozenset(_FAMILIES)


def model_shape(config: dict[str, Any], seq_len: int | None = None) -> ModelShape:
    """The shape of a Hugging Face config dict; exact for the families above, else counted on the
    meta device (needs torch + transformers, still no weights and no download)."""
    family = config.get("model_type")
    if family in _FAMILIES:
        return _FAMILIES[family](config, seq_len)
    return meta_device_shape(config, seq_len)


def meta_device_count(config: dict[str, Any]) -> int:
    """Parameters counted by building the model on the meta device (no memory, no weights)."""
    return _meta_device_count(config)[0]


def _meta_device_count(config: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The count, and the config as transformers completes it (its defaults for what ``config``
    leaves out, which the model was built with)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # its advice on building the model (is_decoder=True) is not the user's
    settings = dict(config)
    hf_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    # Tied weights are one tensor: count each storage once, as the optimizer sees them.
    return sum({id(p): p.numel() for p in model.parameters()}.values()), hf_config.to_dict()


def meta_device_shape(config: dict[str, Any], seq_len: int | None) -> ModelShape:
    try:
        params, full = _meta_device_count(config)
    except ImportError as exc:
        raise MissingPackage(
            f"model_type {config.get('model_type')!r} has no closed form here ({', '.join(sorted(_FAMILIES))}); counting "
            f"its parameters on the meta device needs torch and transformers, and {exc.name or 'one'} is not "
            "importable: pip install 'clusterkit[train]'"
        ) from None
    except (ValueError, TypeError, KeyError) as exc:  # transformers refused the config
        first_sentence = (str(exc).splitlines() or [""])[0].split(". ", 1)[0][:200]
        raise UnknownArchitecture(
            f"cannot build model_type {config.get('model_type')!r} from its config: {first_sentence}"
        ) from None
    d = _get(full, "hidden_size", "n_embd", "d_model")
    return ModelShape(
        params,
        _get(full, "num_hidden_layers", "n_layer", "num_layers"),
        d,
        _get(full, "num_attention_heads", "n_head", "num_heads"),
        _get(full, "vocab_size"),
        seq_len or _get(full, "max_position_embeddings", "n_positions", default=2048),
        full.get("intermediate_size") or 4 * d,
        _get(full, "vocab_size") * d,
        str(config.get("model_type")),
    )

"""``clusterkit export RUN_DIR``: a model that ``from_pretrained`` loads, from a run's newest
checkpoint — consolidating ZeRO shards (DeepSpeed's zero_to_fp32) when the checkpoint has them."""

from __future__ import annotations

from pathlib import Path


class ExportError(RuntimeError):
    pass


def newest_checkpoint(run_dir: Path) -> Path:
    from transformers.trainer_utils import get_last_checkpoint

    checkpoints = run_dir / "checkpoints"
    found = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if not found:
        raise ExportError(f"no checkpoint under {checkpoints}")
    return Path(found)


def export_model(run_dir: Path, out_dir: Path, checkpoint: Path | None = None) -> Path:
    """Write ``out_dir/model.safetensors`` + ``config.json``; returns the checkpoint exported."""
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint = checkpoint or newest_checkpoint(run_dir)
    config = AutoConfig.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_config(config)
    if list(checkpoint.glob("global_step*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {name for name in missing if _is_tied(model, name)}
        if set(missing) - tied or unexpected:
            raise ExportError(f"checkpoint does not match the model: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
        model.tie_weights()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    return checkpoint


def _is_tied(model, name: str) -> bool:
    """A parameter missing from the shards because it shares storage with another (lm_head / embeddings)."""
    output = model.get_output_embeddings()
    return output is not None and name.startswith("lm_head") and getattr(model.config, "tie_word_embeddings", False)

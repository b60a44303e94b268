"""``clusterkit export RUN_DIR``: a model that ``from_pretrained`` loads, from a run's newest
complete, intact checkpoint — consolidating ZeRO shards (DeepSpeed's zero_to_fp32) when the
checkpoint has them. A checkpoint without clusterkit's completion marker (a write that was cut off)
or with a damaged file is never exported."""

from __future__ import annotations

import sys
from pathlib import Path

from clusterkit.errors import UserError
from clusterkit.runs.checkpoint_files import checkpoints_dir, damage, newest_usable
from clusterkit.runs.output_dir import check_output_dir, write_output
from clusterkit.spec.layout import COMPLETE, WEIGHTS


class ExportError(UserError, RuntimeError):
    """No checkpoint that can be exported (none complete and intact, or not this model's): nothing written."""


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest usable checkpoint; newer damaged ones are named on stderr and skipped."""
    directory = checkpoints_dir(run_dir)
    found, damaged = newest_usable(directory)
    for checkpoint, problem in damaged:
        print(f"clusterkit export: skipping {checkpoint}: {problem}", file=sys.stderr)
    if found is None:
        raise ExportError(f"no complete, intact checkpoint under {directory}")
    return found


def usable(checkpoint: Path) -> Path:
    """A checkpoint named by the user, if complete and intact."""
    if not (checkpoint / COMPLETE).is_file():
        raise ExportError(
            f"{checkpoint} is not a complete checkpoint (no {COMPLETE} marker: its write was cut off, "
            "or it is no checkpoint folder)"
        )
    problem = damage(checkpoint)
    if problem:
        raise ExportError(f"{checkpoint} is damaged: {problem}")
    return checkpoint


def export_model(run_dir: Path, out_dir: Path, checkpoint: Path | None = None) -> Path:
    """Write ``out_dir/model.safetensors`` + ``config.json``; returns the checkpoint exported.
    ``out_dir`` is new, empty or an earlier export (replaced whole): a folder of the user's own is
    refused before the model is loaded (:mod:`clusterkit.runs.output_dir`)."""
    check_output_dir(out_dir, "export")
    from transformers import AutoConfig, AutoModelForCausalLM

    checkpoint = usable(checkpoint) if checkpoint else newest_checkpoint(run_dir)
    config = AutoConfig.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_config(config)
    if list(checkpoint.glob("global_step*")) and not (checkpoint / WEIGHTS).is_file():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {name for name in missing if _is_tied(model, name)}
        if set(missing) - tied or unexpected:
            raise ExportError(
                f"checkpoint does not match the model: missing {sorted(set(missing) - tied)}, unexpected {unexpected}"
            )
        model.tie_weights()
    else:  # plain weights, or the full weights the runner wrote beside DeepSpeed's shards (AutoTP)
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    write_output(
        out_dir, "export", f"clusterkit export of {checkpoint}", lambda folder: model.save_pretrained(str(folder))
    )
    return checkpoint


def _is_tied(model, name: str) -> bool:
    """A parameter missing from the shards because it shares storage with another (lm_head / embeddings)."""
    output = model.get_output_embeddings()
    return output is not None and name.startswith("lm_head") and getattr(model.config, "tie_word_embeddings", False)

"""The GPU defaults of the built-in runner, each overridable: bf16 (the GPU profiles'
default precision), fused AdamW, fused attention (SDPA, FlashAttention-2 where installed), TF32 on
Ampere and later (set at run time), torch.compile through task.trainer.args, and gradient
checkpointing turned on where the memory estimate says the recipe needs it. No GPU here: these are
checked as settings, not timed (docs/guides/parallelism.md says what ran where)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.runtime.model import attention_implementation
from clusterkit.runtime.train import training_settings

LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
}


def _recipe(tmp_path: Path, micro: int, **args) -> Path:
    body = {
        "name": "gpu",
        "cluster": "apptainer-a100",
        "resources": {"nodes": 2, "gpus_per_node": 4, "time": "60"},
        "parallelism": {"zero_stage": 3, "micro_batch_size": micro},
        "task": {"trainer": {"model": {"config": LLAMA_7B}, "dataset": {"seq_len": 4096}, "args": args}},
    }
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize(
    "on_gpu, flash, expected", [(True, True, "flash_attention_2"), (True, False, None), (False, True, None)]
)
def test_fused_attention_is_the_default(on_gpu: bool, flash: bool, expected: str | None) -> None:
    """None: transformers' own choice, SDPA wherever the architecture has it."""
    assert attention_implementation(on_gpu, flash) == expected


def test_gpu_profiles_get_bf16_and_fused_adamw_and_user_args_win(tmp_path: Path) -> None:
    loaded = load_recipe(_recipe(tmp_path, 1, optim="adamw_torch", torch_compile=True))
    assert loaded.recipe.precision == "bf16"
    settings = training_settings(loaded.recipe, loaded.profile, tmp_path)
    assert settings["bf16"] is True and settings["optim"] == "adamw_torch" and settings["torch_compile"] is True
    plain = load_recipe(_recipe(tmp_path, 1))
    assert training_settings(plain.recipe, plain.profile, tmp_path)["optim"] == "adamw_torch_fused"


def test_gradient_checkpointing_is_turned_on_where_the_estimate_needs_it(tmp_path: Path) -> None:
    # Llama-2-7B, ZeRO-3 over 8 A100 40GB, micro batch 4 x 4096 tokens: ~96 GiB without, ~28 GiB with.
    loaded = load_recipe(_recipe(tmp_path, 4))
    assert loaded.recipe.task.trainer.args["gradient_checkpointing"] is True
    assert any(
        "gradient_checkpointing turned on: an estimated 96.4 GiB per GPU without it, 28.4 GiB with it" in str(w)
        for w in loaded.warnings
    )
    kept_off = load_recipe(_recipe(tmp_path, 4, gradient_checkpointing=False))
    assert kept_off.recipe.task.trainer.args["gradient_checkpointing"] is False
    assert any("does not fit the 40 GiB GPUs" in str(w) for w in kept_off.warnings)
    fits = load_recipe(_recipe(tmp_path, 1))  # ~37 GiB: nothing to turn on
    assert "gradient_checkpointing" not in fits.recipe.task.trainer.args

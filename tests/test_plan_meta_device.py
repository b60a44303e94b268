"""`clusterkit plan` for a model family with no closed form (qwen3): counted on the meta device
where torch and transformers are installed (nothing downloaded, no weights); one line saying what
to install where they are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterkit.estimate.modelsize import meta_device_count, model_shape
from conftest import REPO, run_cli
from without_torch import run_cli_without_torch

pytest.importorskip("transformers")

QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def _qwen3_by_hand(c: dict) -> int:
    """Qwen3 is Llama's block plus an RMSNorm over each head's queries and keys (q_norm, k_norm)."""
    d, hd, inner = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    block = d * q + 2 * d * kv + q * d + 2 * hd + 3 * d * inner + 2 * d
    return c["vocab_size"] * d + c["num_hidden_layers"] * block + d  # lm_head tied to the embedding


def _recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "qwen3.yaml"
    recipe.write_text(
        "name: qwen3\ncluster: infiniband-h100\nresources: {nodes: 1, gpus_per_node: 8, time: '60'}\n"
        f"task: {{trainer: {{model: {{config: {json.dumps(QWEN3)}}}}}}}\n"
    )
    return recipe


def test_the_meta_device_count_equals_the_closed_form() -> None:
    """The counter itself, against the closed form of a family that has one (and of qwen3, by hand)."""
    llama = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    assert meta_device_count(llama) == model_shape(llama).params
    assert meta_device_count(QWEN3) == _qwen3_by_hand(QWEN3) == 596_049_920


def test_plan_counts_a_family_without_a_closed_form_on_the_meta_device(tmp_path: Path) -> None:
    done = run_cli("plan", str(_recipe(tmp_path)), "--json", cwd=REPO)
    assert done.returncode == 0, done.stderr
    model = json.loads(done.stdout)["model"]
    assert model["params"] == _qwen3_by_hand(QWEN3) and model["family"] == "qwen3"
    assert model["layers"] == 28 and model["hidden"] == 1024


def test_plan_without_torch_says_what_to_install(tmp_path: Path) -> None:
    """Stands in for a login node without torch: the child cannot import it."""
    recipe = _recipe(tmp_path)
    assert run_cli_without_torch("validate", str(recipe), cwd=REPO).returncode == 0  # validate needs no torch
    for extra in ((), ("--json",)):
        done = run_cli_without_torch("plan", str(recipe), *extra, cwd=REPO)
        assert done.returncode == 1 and done.stdout == ""  # this machine lacks a package: not the recipe's fault
        assert done.stderr == (
            "clusterkit: model_type 'qwen3' has no closed form here (gpt2, llama, mistral, qwen2); "
            "counting its parameters on the meta device needs torch and transformers, and torch is "
            "not importable: pip install 'clusterkit[train]'\n"
        )


def test_what_the_config_leaves_out_is_transformers_default(tmp_path: Path) -> None:
    """`{model_type: bert}` alone: the model is built, and its shape read, with BertConfig's
    defaults; transformers' own advice on building it does not reach the user."""
    recipe = tmp_path / "bert.yaml"
    recipe.write_text(
        "name: bert\ncluster: infiniband-h100\nresources: {nodes: 1, gpus_per_node: 8, time: '60'}\n"
        "task: {script: train.py, model_config: {model_type: bert}}\n"
    )
    done = run_cli("plan", str(recipe), "--json", cwd=REPO)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    model = json.loads(done.stdout)["model"]
    assert (model["layers"], model["hidden"], model["heads"], model["vocab"]) == (12, 768, 12, 30522)
    assert model["params"] == meta_device_count({"model_type": "bert"})

"""Issue 15, FSDP2 for the built-in runner: refused on CPU at validate (accelerate would run plain
DDP there), the rendered FSDP2/HSDP configuration checked against accelerate's own dataclasses, its
memory estimated like ZeRO-3, and a run whose parameters are not sharded named as such. No GPU here:
an FSDP2 run itself needs one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.errors import RecipeError
from clusterkit.estimate.memory import Layout
from clusterkit.spec.fsdp_config import fsdp_training_arguments, hsdp_sizes
from conftest import REPO, run_cli

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def _recipe(tmp_path: Path, fsdp: dict, cluster: str = "infiniband-h100", **parallelism) -> Path:
    body = {
        "name": "sharded",
        "cluster": cluster,
        "resources": {"nodes": 2, "gpus_per_node": 8, "time": "60"},
        "parallelism": {"micro_batch_size": 2, "fsdp": fsdp, **parallelism},
        "task": {"trainer": {"model": {"config": LLAMA}, "dataset": {"seq_len": 128}}},
    }
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_fsdp_on_the_cpu_dev_profile_stops_at_validate(tmp_path: Path) -> None:
    path = _recipe(tmp_path, {}, cluster="dev")
    body = yaml.safe_load(path.read_text())
    body["resources"]["gpus_per_node"] = 2
    path.write_text(yaml.safe_dump(body))
    done = run_cli("validate", str(path), cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert (
        "parallelism.fsdp: FSDP2 cannot run on CPU (cluster profile 'dev')" in lines[0]
        and "use zero_stage: 3" in lines[0]
    )


@pytest.mark.parametrize(
    "fsdp, parallelism, message",
    [
        ({}, {"zero_stage": 2}, "FSDP2 replaces DeepSpeed"),
        ({"shard_size": 3}, {}, "parallelism.fsdp.shard_size: 3 must divide the 16 data-parallel ranks"),
        ({"auto_wrap": "Llama Layer"}, {}, "parallelism.fsdp.auto_wrap"),
    ],
)
def test_what_fsdp_cannot_be_combined_with_is_refused(
    tmp_path: Path, fsdp: dict, parallelism: dict, message: str
) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, fsdp, **parallelism))
    assert message in str(raised.value)


def test_the_fsdp2_settings_are_what_accelerates_plugin_takes(tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy
    from transformers import TrainingArguments

    recipe = load_recipe(
        _recipe(
            tmp_path,
            {
                "auto_wrap": "LlamaDecoderLayer",
                "activation_checkpointing": True,
                "cpu_offload": True,
                "reshard_after_forward": False,
            },
        )
    ).recipe
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", **fsdp_training_arguments(recipe)
    )
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"] and plugin.activation_checkpointing is True
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) and "SHARDED_STATE_DICT" in str(plugin.state_dict_type)
    assert hsdp_sizes(recipe) is None  # every rank in one shard group


def test_hsdp_replicates_shard_groups_through_accelerates_parallelism_config(tmp_path: Path) -> None:
    from accelerate.parallelism_config import ParallelismConfig

    recipe = load_recipe(_recipe(tmp_path, {"shard_size": 8, "state_dict": "full"})).recipe
    replicas, shard = hsdp_sizes(recipe)
    config = ParallelismConfig(dp_replicate_size=replicas, dp_shard_size=shard)
    assert (replicas, shard) == (2, 8) and config.total_size == recipe.world_size
    assert config.dp_replicate_enabled and config.dp_shard_enabled
    assert fsdp_training_arguments(recipe)["fsdp_config"]["state_dict_type"] == "FULL_STATE_DICT"


def test_fsdp_memory_is_estimated_like_zero3_over_its_shard_group(tmp_path: Path) -> None:
    recipe = load_recipe(_recipe(tmp_path, {"shard_size": 8})).recipe
    layout = Layout.of_recipe(recipe)
    assert (layout.dp, layout.zero_stage) == (8, 3)
    plan = run_cli("plan", str(_recipe(tmp_path, {})), "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr


def test_a_run_whose_parameters_are_not_sharded_is_named() -> None:
    import msgspec

    from clusterkit.runtime.applied_layout import mismatch
    from clusterkit.spec.recipe import Fsdp

    recipe = load_recipe(REPO / "recipes" / "llama-7b-zero3-ib.yaml").recipe
    fsdp_recipe = msgspec.structs.replace(recipe, parallelism=msgspec.structs.replace(recipe.parallelism, fsdp=Fsdp()))
    facts = {
        "tp_size": 1,
        "dp_size": fsdp_recipe.parallelism.dp,
        "attention_weight": None,
        "attention_shard_shape": None,
        "fsdp_sharded": False,
    }
    assert "no parameter is a sharded DTensor" in mismatch(fsdp_recipe, facts, object())
    assert mismatch(fsdp_recipe, {**facts, "fsdp_sharded": True}, object()) is None

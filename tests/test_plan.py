"""`clusterkit plan`: exact parameter counts, model-state bytes against real tensors and against
DeepSpeed's own estimators, each advice rule on a constructed case, and the ranking."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.estimate.memory import Layout, activation_bytes, model_state_bytes
from clusterkit.estimate.modelsize import model_shape
from clusterkit.plan.planner import plan
from conftest import RECIPES, run_cli

GPT2_124M = {"model_type": "gpt2"}
LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
}
LLAMA2_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}


@pytest.mark.parametrize(
    "config,known",
    [(GPT2_124M, 124_439_808), (LLAMA2_7B, 6_738_415_616), (LLAMA2_70B, 68_976_648_192)],
    ids=["gpt2-124m", "llama2-7b", "llama2-70b"],
)
def test_parameter_counts_match_known_totals(config: dict, known: int) -> None:
    assert model_shape(config).params == known


@pytest.mark.parametrize(
    "config",
    [
        GPT2_124M,
        LLAMA2_7B,
        {
            "model_type": "qwen2",
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 1000,
            "tie_word_embeddings": True,
        },
        {
            "model_type": "llama",
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "vocab_size": 500,
            "attention_bias": True,
        },
    ],
    ids=["gpt2", "llama7b", "qwen2-tied", "llama-gqa-bias"],
)
def test_closed_form_equals_meta_device_count(config: dict) -> None:
    pytest.importorskip("transformers")
    from clusterkit.estimate.modelsize import meta_device_count

    assert model_shape(config).params == meta_device_count(config)


def test_model_states_equal_real_tensor_bytes_after_one_adamw_step() -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 64, "vocab_size": 512}
    settings = dict(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(settings.pop("model_type"), **settings))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = {id(p): p for p in model.parameters()}.values()
    real = sum(p.numel() * p.element_size() for p in params)
    real += sum(p.grad.numel() * p.grad.element_size() for p in params)
    real += sum(
        t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)
    )
    weights, grads, opt, _ = model_state_bytes(model_shape(config), Layout(dp=1), mixed_precision=False)
    assert abs((weights + grads + opt) - real) / real < 0.01


@pytest.mark.parametrize("gpus,nodes,offload_optimizer", [(8, 1, False), (8, 2, False), (4, 1, True)])
def test_zero2_model_states_agree_with_deepspeed(gpus: int, nodes: int, offload_optimizer: bool) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape = model_shape(LLAMA2_7B)
    layout = Layout(dp=gpus * nodes, zero_stage=2, offload_optimizer="cpu" if offload_optimizer else "none")
    ours = sum(model_state_bytes(shape, layout, mixed_precision=True)[:3])
    _, theirs = estimate_zero2_model_states_mem_needs(shape.params, gpus, nodes, cpu_offload=offload_optimizer)
    if offload_optimizer:
        # DeepSpeed's estimator counts only the 16-bit weights on the GPU; on an H100 the run also held
        # this rank's 16-bit gradients (docs/gpu/2026-11-27-h100.md), which the planner adds.
        theirs += 2 * shape.params / layout.dp
    assert abs(ours - theirs) / theirs < 0.05


def test_offloading_the_optimizer_keeps_the_16bit_gradients_on_the_gpu() -> None:
    shape = model_shape(LLAMA2_7B)
    for stage, partition in ((1, 1), (2, 4)):
        layout = Layout(dp=4, zero_stage=stage, offload_optimizer="cpu")
        weights, grads, opt, host = model_state_bytes(shape, layout, mixed_precision=True)
        assert (weights, opt) == (2 * shape.params, 0) and host > 0
        assert grads == int(2 * shape.params / partition)


def test_eager_attention_counts_the_score_matrices() -> None:
    shape = model_shape(LLAMA2_7B, seq_len=2048)
    layout = Layout(dp=1)
    for mixed, score_bytes in ((True, 5), (False, 4)):
        fused = activation_bytes(shape, layout, mixed)
        eager = activation_bytes(shape, layout, mixed, fused_attention=False)
        assert eager - fused == pytest.approx(shape.layers * score_bytes * shape.heads * 2048**2, rel=1e-9)


@pytest.mark.parametrize("offload_optimizer,offload_params", [(False, False), (True, False), (True, True)])
def test_zero3_model_states_agree_with_deepspeed(offload_optimizer: bool, offload_params: bool) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    shape = model_shape(LLAMA2_70B)
    layout = Layout(
        dp=16,
        zero_stage=3,
        offload_optimizer="cpu" if offload_optimizer else "none",
        offload_params="cpu" if offload_params else "none",
    )
    ours = sum(model_state_bytes(shape, layout, mixed_precision=True)[:3])
    _, theirs, _ = estimate_zero3_model_states_mem_needs(
        shape.params, shape.largest_layer_params, 8, 2, cpu_offload=offload_optimizer, cpu_offload_params=offload_params
    )
    assert abs(ours - theirs) / theirs < 0.05


def test_context_parallel_splits_activations_and_widens_zero_sharding() -> None:
    """cp ranks each hold 1/cp of a sequence; ZeRO shards over the dp*cp ranks, the weights (stage 0-2)
    stay whole on each."""
    shape = model_shape(LLAMA2_7B)
    plain, split = Layout(dp=4, zero_stage=3, micro_batch_size=2), Layout(dp=4, zero_stage=3, micro_batch_size=2, cp=4)
    assert activation_bytes(shape, split, True) == pytest.approx(activation_bytes(shape, plain, True) / 4, rel=1e-6)
    # ZeRO-3 over 16 ranks is what a dp=16 layout has.
    assert model_state_bytes(shape, split, True) == model_state_bytes(shape, Layout(dp=16, zero_stage=3), True)
    assert model_state_bytes(shape, Layout(dp=4, cp=4), True) == model_state_bytes(shape, Layout(dp=4), True)
    assert "cp4" in split.describe() and "cp" not in plain.describe()


def _recipe(tmp_path: Path, cluster: str, nodes: int, gpus: int, config: dict, **extra) -> Path:
    data = {
        "name": "p",
        "cluster": cluster,
        "resources": {"nodes": nodes, "gpus_per_node": gpus, "time": "60"},
        "parallelism": {"micro_batch_size": 8, **extra.pop("parallelism", {})},
        "task": {"trainer": {"model": {"config": config}, "dataset": {"seq_len": 2048}}},
        **extra,
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_recipe_with_eager_attention_is_planned_with_its_score_matrices(tmp_path: Path) -> None:
    fused = plan(load_recipe(_recipe(tmp_path, "infiniband-h100", 1, 8, GPT2_124M)))
    recipe = yaml.safe_load(_recipe(tmp_path, "infiniband-h100", 1, 8, GPT2_124M).read_text())
    recipe["task"]["trainer"]["model"]["attention"] = "eager"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(recipe))
    eager = plan(load_recipe(tmp_path / "p.yaml"))
    gained = eager.current_memory.activations - fused.current_memory.activations
    shape = fused.shape  # GPT-2's defaults: 12 layers, 12 heads
    assert gained == pytest.approx(shape.layers * 5 * shape.heads * 2048**2 * 8, rel=1e-6)


def test_rule_small_model_fits_one_gpu_and_ranks_ddp_first(tmp_path: Path) -> None:
    result = plan(load_recipe(_recipe(tmp_path, "infiniband-h100", 1, 8, GPT2_124M)))
    rules = [a.rule for a in result.advice]
    assert "fits-one-gpu" in rules and "needs-sharding" not in rules
    assert result.ranked[0].layout.zero_stage == 0 and result.ranked[0].layout.offload_optimizer == "none"


def test_rule_large_model_needs_sharding_and_zero_beats_ddp(tmp_path: Path) -> None:
    loaded = load_recipe(RECIPES / "llama-7b-zero3-ib.yaml")
    result = plan(loaded, top=50)
    assert "needs-sharding" in [a.rule for a in result.advice]
    # Plain DDP (no ZeRO, no TP) does not fit a 7B model; sharding does, by ZeRO or AutoTP.
    assert result.ranked and all(r.layout.zero_stage > 0 or r.layout.tp > 1 for r in result.ranked)
    assert result.ranked[0].memory.total <= result.gpu_memory


def test_rule_largest_layer_does_not_fit(tmp_path: Path) -> None:
    huge_vocab = {**LLAMA2_7B, "vocab_size": 2_000_000, "hidden_size": 8192, "num_attention_heads": 64}
    result = plan(load_recipe(_recipe(tmp_path, "ethernet", 1, 4, huge_vocab)))
    assert "largest-layer" in [a.rule for a in result.advice]


def test_rule_slow_network_and_zero_with_pp(tmp_path: Path) -> None:
    recipe = tmp_path / "3d.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "eth",
                "cluster": "ethernet",
                "resources": {"nodes": 4, "gpus_per_node": 4, "time": "60"},
                "parallelism": {"tp": 2, "pp": 2, "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 64},
                "task": {"script": "pretrain.py", "model_config": LLAMA2_7B},
            }
        )
    )
    result = plan(load_recipe(recipe), top=20)
    rules = [a.rule for a in result.advice]
    assert "slow-network" in rules and "zero-with-pp" in rules
    assert any(r.layout.pp > 1 or r.layout.tp > 1 for r in result.ranked), "a user script may use TP/PP"
    assert all(r.layout.zero_stage <= 1 for r in result.ranked if r.layout.pp > 1)


def test_multiple_of_8_and_lr_hint(tmp_path: Path) -> None:
    config = {**GPT2_124M, "n_embd": 772, "n_head": 4}
    result = plan(
        load_recipe(_recipe(tmp_path, "infiniband-h100", 1, 8, config, parallelism={"micro_batch_size": 3})),
        global_batch=48,
    )
    texts = {a.rule: a.text for a in result.advice}
    assert "micro batch 3, hidden size 772" in texts["multiple-of-8"]
    assert "global batch 24 -> 48" in texts["lr-scaling"] and "x2.00" in texts["lr-scaling"]


def test_plan_cli_json_and_apply(tmp_path: Path) -> None:
    recipe = tmp_path / "7b.yaml"
    recipe.write_text((RECIPES / "llama-7b-zero3-ib.yaml").read_text())
    done = run_cli("plan", str(recipe), "--json", "--top", "3", "--apply")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"]["params"] == 6_738_415_616 and len(report["ranked"]) == 3
    best = report["ranked"][0]["layout"]
    planned = load_recipe(tmp_path / "7b.planned.yaml")
    assert planned.recipe.parallelism.zero_stage == best["zero_stage"]
    assert planned.recipe.parallelism.micro_batch_size == best["micro_batch_size"]
    assert planned.recipe.parallelism.global_batch_size == 512


def test_plan_without_a_model_shape_is_a_clear_error(tmp_path: Path) -> None:
    recipe = tmp_path / "s.yaml"
    recipe.write_text("name: s\ncluster: infiniband-h100\nresources: {time: '60'}\ntask: {script: x.py}\n")
    done = run_cli("plan", str(recipe))
    assert done.returncode == 2 and "plan needs the model's shape" in done.stderr and "Traceback" not in done.stderr


def test_plan_with_a_model_type_transformers_does_not_know(tmp_path: Path) -> None:
    recipe = tmp_path / "s.yaml"
    recipe.write_text(
        "name: s\ncluster: infiniband-h100\nresources: {time: '60'}\n"
        "task: {script: x.py, model_config: {model_type: nonsense, hidden_size: 64}}\n"
    )
    done = run_cli("plan", str(recipe))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        == f"{recipe}: cannot build model_type 'nonsense' from its config: Unrecognized model identifier: nonsense"
    )


def test_apply_copies_times_and_env_values_as_written(tmp_path: Path) -> None:
    recipe = tmp_path / "7b.yaml"
    recipe.write_text(
        (RECIPES / "llama-7b-zero3-ib.yaml").read_text().replace('time: "1-00:00:00"', "time: 12:00")
        + "env: {PYVER: 3.10, FLAG: yes}\n"
    )
    done = run_cli("plan", str(recipe), "--apply")
    assert done.returncode == 0, done.stderr
    planned = load_recipe(tmp_path / "7b.planned.yaml")
    assert planned.recipe.resources.time == "12:00" and planned.recipe.env == {"PYVER": "3.10", "FLAG": "yes"}


def _plannable(recipe: Path) -> bool:
    """A GPU the profile names and a model the recipe sizes: what plan needs."""
    loaded = load_recipe(recipe)
    return loaded.profile.gpu is not None and bool(loaded.recipe.task.model_size or loaded.model_config)


PLANNABLE = [recipe for recipe in sorted(RECIPES.glob("*.yaml")) if _plannable(recipe)]


def test_most_shipped_recipes_can_be_planned() -> None:
    assert len(PLANNABLE) >= 5, PLANNABLE


@pytest.mark.parametrize("recipe", PLANNABLE, ids=lambda p: p.stem)
def test_a_recipe_layout_that_fits_is_among_the_ranked(recipe: Path) -> None:
    """The shipped Megatron recipe knows only its model's size: its 96 layers and heads were taken as
    1, which no pipeline or tensor split divides, so only pp=1 tp=1 layouts were tried, none fitted,
    and the report said "no layout fits" under a table showing the recipe's own layout fitting."""
    loaded = load_recipe(recipe)
    result = plan(loaded, top=10_000)
    if result.current_memory.total <= result.gpu_memory:
        assert result.ranked, recipe.stem
        assert result.current in [row.layout for row in result.ranked], recipe.stem


def test_plan_of_the_shipped_megatron_recipe_ranks_layouts() -> None:
    done = run_cli("plan", str(RECIPES / "megatron-3d-24node.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["current"]["fits"] and report["ranked"]
    assert {row["layout"]["pp"] for row in report["ranked"]} != {1}  # a 175 B model is split across nodes
    text = run_cli("plan", str(RECIPES / "megatron-3d-24node.yaml"), env={**os.environ, "COLUMNS": "200"})
    assert text.returncode == 0 and "no layout fits" not in text.stdout


def test_when_no_layout_the_search_tries_fits_the_recipes_own_is_not_called_unfit(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "infiniband-h100", 1, 8, GPT2_124M)  # gpt2's 12 heads: no tp of 8, so no dp of 1
    done = run_cli("plan", str(recipe), "--global-batch", "7", env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "yes," in done.stdout and "no layout fits" not in done.stdout
    assert done.stdout.rstrip().endswith("no other layout the plan tries fits on this cluster; the recipe's does")

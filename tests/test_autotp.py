"""Issue 15, tensor parallelism for the built-in runner through DeepSpeed AutoTP: what validate
refuses, the rendered DeepSpeed config, and on the dev cluster (2 nodes x 2 ranks, tp 2 inside each
node, dp 2 across) a real AutoTP run whose rank records prove the layout, whose loss curve equals a
tp 1 run with the same global batch and seed, which resumes, and whose checkpoint exports whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.load.parallel_checks import AUTOTP_UNSUPPORTED
from clusterkit.runtime.applied_layout import mismatch
from conftest import REPO, run_cli

TINY_LLAMA = REPO / "tests" / "recipes" / "tiny-llama-tp.yaml"


def _recipe(tmp_path: Path, **changes) -> Path:
    body = yaml.safe_load(TINY_LLAMA.read_text())
    for dotted, value in changes.items():
        node = body
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp_path / "tp.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_the_deepspeed_config_asks_autotp_for_tp_and_leaves_the_batch_to_deepspeed(tmp_path: Path) -> None:
    loaded = load_recipe(TINY_LLAMA)
    assert loaded.recipe.uses_deepspeed and loaded.recipe.parallelism.dp == 2
    config = json.loads(render_job(loaded).files["ds_config.json"])
    assert config["tensor_parallel"] == {"autotp_size": 2} and config["zero_optimization"]["stage"] == 1
    # The Trainer would check train_batch_size against every rank as data parallel (16, not 8).
    assert "train_batch_size" not in config and config["train_micro_batch_size_per_gpu"] == 4
    plain = json.loads(render_job(load_recipe(_recipe(tmp_path, **{"parallelism.tp": 1}))).files["ds_config.json"])
    assert "tensor_parallel" not in plain and plain["train_batch_size"] == 16


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"task.trainer.model.config.model_type": "gpt2", "task.trainer.model.config.num_key_value_heads": None},
            "DeepSpeed AutoTP cannot shard gpt2 models",
        ),
        ({"parallelism.zero_stage": 3}, "DeepSpeed AutoTP trains with ZeRO stage 0, 1 or 2, not 3"),
        (
            {"task.trainer.model.config.num_key_value_heads": 1},
            "the model's 1 key/value heads are not divisible by tp=2",
        ),
        ({"deepspeed.enabled": False}, "tp=2 trains through DeepSpeed AutoTP; remove enabled: false"),
        ({"parallelism.tp": 4}, "tensor parallelism must stay inside one node"),
        ({"parallelism.pp": 2, "parallelism.tp": 1}, "the built-in HF Trainer runner cannot do pipeline parallelism"),
    ],
)
def test_what_autotp_cannot_run_is_refused_at_validate(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **changes))
    assert message in str(raised.value)


def test_the_unsupported_families_are_deepspeeds_own() -> None:
    from deepspeed.module_inject.auto_tp import AutoTP

    for family in ("gpt2", "xlnet", "deberta"):
        assert family in AUTOTP_UNSUPPORTED and not AutoTP.supported(f"x: {family.upper()}Model(")
    assert AutoTP.supported("x: LlamaModel(") and "llama" not in AUTOTP_UNSUPPORTED
    import inspect

    source = inspect.getsource(AutoTP.supported)
    assert all(f"'{family}'" in source for family in AUTOTP_UNSUPPORTED)


def test_a_layout_that_is_not_the_recipes_is_named() -> None:
    recipe = load_recipe(TINY_LLAMA).recipe
    config = type("Config", (), {"num_attention_heads": 4, "head_dim": None, "hidden_size": 64})()
    good = {"tp_size": 2, "dp_size": 2, "attention_weight": "q_proj.weight", "attention_shard_shape": [32, 64]}
    assert mismatch(recipe, good, config) is None
    assert "the tensor-parallel group has 1 ranks" in mismatch(recipe, {**good, "tp_size": 1}, config)
    assert "holds 64 of 64 output features" in mismatch(recipe, {**good, "attention_shard_shape": [64, 64]}, config)
    # DeepSpeed include/exclude launch fewer ranks than the recipe lays out: dp follows them.
    assert mismatch(recipe, {**good, "dp_size": 1}, config, world_size=2) is None


def _losses(run_dir: Path) -> list[float]:
    return [
        m["loss"] for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m["event"] == "log"
    ]


@pytest.mark.slurm
def test_tensor_parallel_training_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    tp = run_cli("submit", str(TINY_LLAMA), "--follow", "--set", f"runs_dir={runs}", cwd=REPO)
    assert tp.returncode == 0, tp.stdout + tp.stderr
    run_dir = next((runs / "tiny-llama-tp").iterdir())
    ranks = [json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [(r["tp_size"], r["dp_size"], r["slurm_node"]) for r in ranks] == [(2, 2, "node1")] * 2 + [
        (2, 2, "node2")
    ] * 2
    assert {tuple(r["attention_shard_shape"]) for r in ranks} == {(32, 64)}  # half of q_proj's 64 outputs each
    # TP peers (the ranks of a node) train on the same batches, the two DP groups on different ones.
    assert ranks[0]["batch_fingerprints"] == ranks[1]["batch_fingerprints"]
    assert ranks[2]["batch_fingerprints"] == ranks[3]["batch_fingerprints"]
    assert not set(ranks[0]["batch_fingerprints"]) & set(ranks[2]["batch_fingerprints"])
    tp_losses = _losses(run_dir)
    assert len(tp_losses) == 10 and tp_losses[-1] < tp_losses[0]
    # The same global batch (8) and seed as plain data parallelism: the same curve.
    dp = run_cli(
        "submit",
        str(TINY_LLAMA),
        "--follow",
        "--set",
        f"runs_dir={tmp_path / 'dp'}",
        "--set",
        "parallelism.tp=1",
        "--set",
        "parallelism.micro_batch_size=2",
        cwd=REPO,
    )
    assert dp.returncode == 0, dp.stdout + dp.stderr
    dp_losses = _losses(next((tmp_path / "dp" / "tiny-llama-tp").iterdir()))
    assert dp_losses == pytest.approx(tp_losses, rel=1e-4)
    # The final model and an exported checkpoint are whole models (AutoTP's shards gathered).
    from transformers import AutoModelForCausalLM

    exported = run_cli("export", str(run_dir), "-o", str(tmp_path / "export"), cwd=REPO)
    assert exported.returncode == 0, exported.stderr
    for folder in (run_dir / "model", tmp_path / "export"):
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        assert tuple(model.model.layers[0].self_attn.q_proj.weight.shape) == (64, 64)
    # Resuming continues the sharded run from its checkpoint, with the same layout.
    resumed = run_cli(
        "submit", "--resume", str(run_dir), "--set", "task.trainer.args.max_steps=14", "--follow", cwd=REPO
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    second = max((runs / "tiny-llama-tp").iterdir(), key=lambda p: int(p.name))
    record = json.loads((second / "ranks" / "rank-3.json").read_text())
    assert record["resumed_from"] == str(run_dir / "checkpoints" / "checkpoint-10")
    assert (record["global_step"], record["tp_size"], record["attention_shard_shape"]) == (14, 2, [32, 64])


@pytest.mark.slurm
def test_a_requeued_tensor_parallel_run_resumes_from_its_sharded_checkpoint(dev_cluster: str, tmp_path: Path) -> None:
    """Preempted mid-run (SLURM's warning signal, as tests/test_preemption.py sends it), the AutoTP
    run checkpoints, requeues itself and finishes at exactly max_steps with the same layout."""
    from slurm_jobs import events, preempt_once, release, scontrol, wait_done

    done = run_cli(
        "submit",
        str(TINY_LLAMA),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "task.trainer.args.max_steps=300",
        "--set",
        "task.trainer.args.save_steps=100",
        "--set",
        "task.trainer.args.logging_steps=10",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "tiny-llama-tp" / job_id
    preempt_once(job_id, run_dir, starts=1)
    release(job_id)
    assert "COMPLETED" in wait_done(job_id, run_dir)
    assert scontrol(job_id).get("Restarts") == "1"
    (preempted,) = events(run_dir, "preempted")
    records = [json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {r["global_step"] for r in records} == {300}
    assert {r["resumed_from"] for r in records} == {str(run_dir / "checkpoints" / f"checkpoint-{preempted['step']}")}
    assert {(r["tp_size"], r["dp_size"], tuple(r["attention_shard_shape"])) for r in records} == {(2, 2, (32, 64))}


@pytest.mark.slurm
def test_tensor_parallel_under_the_deepspeed_launcher(dev_cluster: str, tmp_path: Path) -> None:
    """The other launcher: DeepSpeed's, one per node, applies the same AutoTP layout."""
    done = run_cli(
        "submit",
        str(TINY_LLAMA),
        "--follow",
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "launcher=deepspeed",
        "--set",
        "task.trainer.args.max_steps=4",
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "tiny-llama-tp").iterdir())
    ranks = [json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {(r["tp_size"], r["dp_size"], tuple(r["attention_shard_shape"])) for r in ranks} == {(2, 2, (32, 64))}
    assert ranks[0]["batch_fingerprints"] == ranks[1]["batch_fingerprints"] != ranks[2]["batch_fingerprints"]

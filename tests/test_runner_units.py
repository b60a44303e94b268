"""The built-in runner's pieces, in one process: data builders, model builders and the mapping of a
recipe to TrainingArguments keywords (for a GPU profile too, which cannot run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterkit import load_recipe
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import DatasetSpec, ModelSpec
from clusterkit.spec.resolved import ResolvedRecipe
from conftest import RECIPES

torch = pytest.importorskip("torch")
from clusterkit.runtime.data import build_dataset  # noqa: E402
from clusterkit.runtime.model import build_model  # noqa: E402
from clusterkit.runtime.train import training_settings  # noqa: E402


def _job(recipe_path: Path, *overrides: str) -> tuple[ResolvedRecipe, ClusterProfile]:
    loaded = load_recipe(recipe_path, overrides)
    return loaded.recipe, loaded.profile


def test_synthetic_samples_differ_and_are_learnable_sequences() -> None:
    data = build_dataset(DatasetSpec(type="synthetic", seq_len=16, num_samples=64), None, 512, seed=1, base_dir=Path())
    rows = {tuple(data[i]["input_ids"].tolist()) for i in range(len(data))}
    assert len(data) == 64 and len(rows) > 60
    ids = data[0]["input_ids"]
    steps = {int((ids[i + 1] - ids[i]) % 512) for i in range(15)}
    assert len(steps) == 1, "each sample is an arithmetic sequence mod vocab"
    assert torch.equal(data[0]["labels"], ids)


def test_text_and_jsonl_datasets_byte_level(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("hello world " * 20)
    text = build_dataset(DatasetSpec(type="text", path="corpus.txt", seq_len=16), None, 512, seed=0, base_dir=tmp_path)
    assert len(text) == 240 // 16 and text[0]["input_ids"][:5].tolist() == list(b"hello")
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"body": "abc " * 10}) for _ in range(4)) + "\n")
    jsonl = build_dataset(
        DatasetSpec(type="jsonl", path=str(tmp_path / "docs.jsonl"), field="body", seq_len=8),
        None,
        512,
        seed=0,
        base_dir=Path(),
    )
    assert len(jsonl) == 160 // 8
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        build_dataset(DatasetSpec(type="text", path="corpus.txt", seq_len=16), None, 100, seed=0, base_dir=tmp_path)
    with pytest.raises(ValueError, match="fewer than one block"):
        build_dataset(DatasetSpec(type="text", path="corpus.txt", seq_len=10_000), None, 512, seed=0, base_dir=tmp_path)


def test_model_from_inline_config_and_config_file(tmp_path: Path) -> None:
    config = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 300}
    inline = build_model(ModelSpec(config=config), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_file = build_model(ModelSpec(config="config.json"), tmp_path)
    assert inline.config.n_layer == from_file.config.n_layer == 1
    assert sum(p.numel() for p in inline.parameters()) == sum(p.numel() for p in from_file.parameters())


def test_training_settings_on_cpu(tmp_path: Path) -> None:
    recipe, profile = _job(RECIPES / "tiny-gpt2-cpu.yaml", "task.trainer.args.logging_steps=3")
    settings = training_settings(recipe, profile, tmp_path)
    assert settings["use_cpu"] is True and settings["ddp_backend"] == "gloo"
    assert settings["per_device_train_batch_size"] == 4 and settings["gradient_accumulation_steps"] == 1
    assert settings["optim"] == "adamw_torch" and settings["dataloader_num_workers"] == 0
    assert settings["logging_steps"] == 3, "the recipe's args override the defaults"
    assert settings["output_dir"] == str(tmp_path / "checkpoints")
    assert "deepspeed" not in settings
    assert "ddp_timeout" not in settings  # the Trainer's own default


@pytest.mark.parametrize("recipe_file", ["tiny-gpt2-cpu.yaml", "llama-7b-zero3-ib.yaml"])
def test_collective_timeout_is_the_trainers_ddp_timeout_on_gloo_and_nccl(recipe_file: str, tmp_path: Path) -> None:
    recipe, profile = _job(RECIPES / recipe_file, "collective_timeout=45m")
    assert training_settings(recipe, profile, tmp_path)["ddp_timeout"] == 2700


def test_training_settings_on_gpu(tmp_path: Path) -> None:
    recipe, profile = _job(RECIPES / "llama-7b-zero3-ib.yaml")
    settings = training_settings(recipe, profile, tmp_path)
    assert settings["use_cpu"] is False and "ddp_backend" not in settings
    assert settings["bf16"] is True and settings["fp16"] is False
    assert settings["optim"] == "adamw_torch_fused" and settings["dataloader_pin_memory"] is True
    assert settings["dataloader_num_workers"] == 4  # 96 CPUs / 8 ranks, capped at 4
    assert settings["gradient_checkpointing"] is True
    assert settings["deepspeed"] == str(tmp_path / "ds_config.json")
    assert settings["per_device_train_batch_size"] * settings["gradient_accumulation_steps"] * 16 == 512


class _Recorder:
    """What save_model asked of a Trainer, its accelerator and its model (the FSDP and AutoTP paths
    need GPUs or DeepSpeed engines; their shape is what is checked here, their run in bench/gpu)."""

    def __init__(self, *, fsdp: bool = False, autotp: int = 1) -> None:
        self.calls: list[tuple] = []
        self.is_fsdp_enabled = fsdp
        recorder = self

        class Model:
            def save_pretrained(self, out_dir: str, state_dict: dict) -> None:
                recorder.calls.append(("save_pretrained", out_dir, state_dict))

        class Engine:
            def autotp_size(self) -> int:
                return autotp

            def _consolidated_16bit_state_dict(self) -> dict:
                recorder.calls.append(("gather_autotp",))
                return {"w": "autotp"}

        class Accelerator:
            def get_state_dict(self, model: object) -> dict:
                recorder.calls.append(("gather_fsdp",))
                return {"w": "full"}

            def unwrap_model(self, model: object) -> object:
                return model

        self.model, self.model_wrapped, self.accelerator = Model(), Engine(), Accelerator()

    def save_model(self, out_dir: str) -> None:
        self.calls.append(("trainer.save_model", out_dir))


@pytest.mark.parametrize("rank_zero", [True, False])
def test_final_model_gathered_where_ranks_hold_shards(rank_zero: bool) -> None:
    """FSDP with sharded checkpoints: the Trainer's save_model writes no weights (found on an H100);
    every rank gathers (a collective) and rank 0 alone writes the full model."""
    from clusterkit.runtime.train import save_model

    for trainer, gathered in ((_Recorder(fsdp=True), ("gather_fsdp",)), (_Recorder(autotp=2), ("gather_autotp",))):
        save_model(trainer, Path("out"), rank_zero)
        written = [("save_pretrained", "out", {"w": "full" if trainer.is_fsdp_enabled else "autotp"})]
        assert trainer.calls == [gathered, *(written if rank_zero else [])]
    plain = _Recorder()
    save_model(plain, Path("out"), rank_zero)
    assert plain.calls == [("trainer.save_model", "out")]


def test_each_checkpoint_save_is_timed_in_the_metrics(tmp_path: Path) -> None:
    """`clusterkit report` counts checkpointing time from the runner's ``checkpoint`` lines: one per
    save, after that step's log line, with the seconds the save took."""
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    from clusterkit.runtime.checkpoints import CheckpointPublisher
    from clusterkit.runtime.train import MetricsWriter
    from clusterkit.supervisor.run_files import json_objects

    config = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 300}
    data = build_dataset(DatasetSpec(type="synthetic", seq_len=16, num_samples=32), None, 300, seed=1, base_dir=Path())
    args = TrainingArguments(
        output_dir=str(tmp_path / "checkpoints"),
        max_steps=4,
        logging_steps=1,
        save_steps=2,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    metrics = MetricsWriter(tmp_path / "metrics.jsonl", global_batch=2, seq_len=16, world_size=1)
    publisher = CheckpointPublisher(None, record=metrics.record)

    class AsksAfterThePublisher(TrainerCallback):  # as the preemption handler does, at step 3
        def on_step_end(self, args, state, control, **kwargs):
            control.should_save = control.should_save or state.global_step == 3

    trainer = Trainer(
        model=build_model(ModelSpec(config=config), tmp_path),
        args=args,
        train_dataset=data,
        data_collator=default_data_collator,
        callbacks=[metrics, publisher, AsksAfterThePublisher()],
    )
    trainer.train()
    lines = json_objects((tmp_path / "metrics.jsonl").read_text())
    saves = [line for line in lines if line["event"] == "checkpoint"]
    assert [save["step"] for save in saves] == [2, 3, 4]
    assert all(0 < save["save_s"] < 60 for save in saves)
    for save in saves:
        logged = next(line for line in lines if line["event"] == "log" and line["step"] == save["step"])
        assert logged["time"] <= save["time"] - save["save_s"] + 1e-3, "the save is timed after the step's log"

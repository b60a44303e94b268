"""A tiny GPT-2 trained by the built-in runner's Trainer (with its step-time recorder) on two CPU
ranks, where the rank named by SLOW_RANK_FOR_TEST sleeps in its data collator: a straggler made on
purpose, by this test script only (no such hook exists in clusterkit). Argument: the run directory
(default: $RUN_DIR, as a script task of a job)."""

import os
import sys
import time
from pathlib import Path

from transformers import TrainingArguments, default_data_collator

from clusterkit.runtime.data import build_dataset
from clusterkit.runtime.model import build_model
from clusterkit.runtime.step_times import StepTimes
from clusterkit.runtime.train import FingerprintingTrainer
from clusterkit.spec import layout
from clusterkit.spec.recipe import DatasetSpec, ModelSpec

run_dir = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["RUN_DIR"])  # RUN_DIR: as a job's script task
rank = int(os.environ["RANK"])
slow = rank == int(os.environ["SLOW_RANK_FOR_TEST"])


def collate(features):
    if slow:
        time.sleep(0.25)
    return default_data_collator(features)


config = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 300, "n_positions": 32}
model = build_model(ModelSpec(config=config), run_dir)
data = build_dataset(DatasetSpec(type="synthetic", seq_len=16, num_samples=256), None, 300, seed=0, base_dir=run_dir)
args = TrainingArguments(
    output_dir=str(run_dir / "out"),
    max_steps=int(os.environ.get("STEPS_FOR_TEST", "8")),
    per_device_train_batch_size=2,
    use_cpu=True,
    ddp_backend="gloo",
    report_to="none",
    save_strategy="no",
    logging_steps=100,
    disable_tqdm=True,
    dataloader_num_workers=0,
)
step_times = StepTimes(run_dir / layout.step_times(rank))
trainer = FingerprintingTrainer(
    model=model, args=args, train_dataset=data, data_collator=collate, callbacks=[step_times], step_times=step_times
)
trainer.train()

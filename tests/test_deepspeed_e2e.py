"""DeepSpeed on the dev cluster without SSH: every ZeRO stage across 2 nodes x 2 ranks with the
DeepSpeed launcher (and ZeRO-2 under torchrun), offload to CPU, resume from a checkpoint, and a
ZeRO-3 model that from_pretrained loads. Each asserts what the job really did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, run_cli
from slurm_jobs import TINY, assert_real_data_parallel, metrics, rank_records, submit

pytestmark = pytest.mark.slurm
ZERO_OPTIMIZER = {1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}


def _deepspeed(stage: int, *extra: str) -> tuple[str, ...]:
    return ("--set", "launcher=deepspeed", "--set", f"parallelism.zero_stage={stage}", *extra)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_trains_and_resumes(dev_cluster: str, tmp_path: Path, stage: int) -> None:
    rc, first, output = submit(
        tmp_path,
        TINY,
        *_deepspeed(
            stage,
            "--set",
            "task.trainer.args.max_steps=6",
            "--set",
            "task.trainer.args.save_steps=3",
            "--set",
            "task.trainer.args.logging_steps=2",
        ),
    )
    assert rc == 0, output
    assert_real_data_parallel(first, world=4, nodes={"node1", "node2"})
    assert {(r["zero_stage"], r["optimizer"]) for r in rank_records(first)} == {(stage, ZERO_OPTIMIZER[stage])}
    # A second job continues from the first one's newest checkpoint (step 6) up to step 10.
    rc, second, output = submit(tmp_path, TINY, "--resume", str(first), "--set", "task.trainer.args.max_steps=10")
    assert rc == 0, output
    assert second != first
    records = rank_records(second)
    assert {r["resumed_from"] for r in records} == {str(first / "checkpoints" / "checkpoint-6")}
    assert {r["global_step"] for r in records} == {10}
    start = next(m for m in metrics(second) if m["event"] == "start")
    assert start["step"] == 6 and start["world_size"] == 4


@pytest.mark.parametrize("stage,offload_optimizer,offload_params", [(2, "cpu", "none"), (3, "none", "cpu")])
def test_offload_to_cpu(
    dev_cluster: str, tmp_path: Path, stage: int, offload_optimizer: str, offload_params: str
) -> None:
    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        *_deepspeed(
            stage,
            "--set",
            f"parallelism.offload_optimizer={offload_optimizer}",
            "--set",
            f"parallelism.offload_params={offload_params}",
            "--set",
            "task.trainer.args.max_steps=10",
        ),
    )
    assert rc == 0, output
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    facts = {(r["offload_optimizer"], r["offload_params"]) for r in rank_records(run_dir)}
    assert facts == {(offload_optimizer, offload_params)}


def test_torchrun_with_zero2(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(
        tmp_path, TINY, "--set", "parallelism.zero_stage=2", "--set", "task.trainer.args.max_steps=10"
    )
    assert rc == 0, output
    assert '"torch.distributed.run"' in (run_dir / "plan.json").read_text()
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    assert {r["optimizer"] for r in rank_records(run_dir)} == {"DeepSpeedZeroOptimizer"}


def test_zero3_model_loads_and_matches_the_shards(dev_cluster: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    rc, run_dir, output = submit(
        tmp_path,
        TINY,
        *_deepspeed(3, "--set", "task.trainer.args.max_steps=10", "--set", "task.trainer.args.save_steps=10"),
    )
    assert rc == 0, output
    assert list((run_dir / "checkpoints" / "checkpoint-10").glob("global_step10/*zero_pp_rank_*")), "ZeRO-3 shards"
    export = run_cli("export", str(run_dir), "-o", str(tmp_path / "consolidated"), cwd=REPO)
    assert export.returncode == 0, export.stderr
    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "model"))
    from_shards = AutoModelForCausalLM.from_pretrained(str(tmp_path / "consolidated"))
    shards = from_shards.state_dict()
    for name, tensor in list(final.state_dict().items())[:8]:
        assert torch.equal(tensor, shards[name]), name
    trained = sum(p.double().sum().item() for p in final.parameters())
    # The gathered parameters every rank summed at the end are the ones from_pretrained loads.
    assert {round(r["parameter_checksum"], 6) for r in rank_records(run_dir)} == {round(trained, 6)}


def test_exclude_a_gpu(dev_cluster: str, tmp_path: Path) -> None:
    rc, run_dir, output = submit(
        tmp_path, TINY, *_deepspeed(2, "--set", "deepspeed.exclude=node2:1", "--set", "task.trainer.args.max_steps=6")
    )
    assert rc == 0, output
    records = rank_records(run_dir)
    assert sorted(r["rank"] for r in records) == [0, 1, 2]
    assert [r["slurm_node"] for r in records] == ["node1", "node1", "node2"]
    assert {r["world_size"] for r in records} == {3}
    assert json.loads((run_dir / "ds_config.json").read_text())["train_batch_size"] == "auto"
    start = next(m for m in metrics(run_dir) if m["event"] == "start")
    assert start["global_batch_size"] == 12  # 4 per rank x 3 ranks

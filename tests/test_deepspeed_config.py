"""DeepSpeed's own config class accepts every rendered ds_config.json at the recipe's DP size,
and its batch assertion rejects a wrong one (so the check is real). Needs the [train] extra."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterkit import load_recipe, render_job
from conftest import RECIPES, REPO

deepspeed = pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")


class _DataParallelOnly:
    """The minimal model-parallel unit DeepSpeedConfig asks for its data-parallel world size."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module")
def deepspeed_comm() -> Iterator[None]:
    # DeepSpeedConfig reads the world size from deepspeed.comm; one gloo process stands for the job
    # and the mpu object supplies the recipe's data-parallel size. The variables are put back after:
    # left in this process they would reach every job later tests submit (sbatch exports them).
    single = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    saved = {name: os.environ.get(name) for name in single}
    os.environ.update(single)
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    torch.distributed.destroy_process_group()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _zero_variants(tmp_path: Path) -> list[Path]:
    """Every ZeRO stage and offload combination on the tiny layout, besides the shipped recipes."""
    variants = []
    for stage, offload_opt, offload_params in [
        (1, "none", "none"),
        (2, "cpu", "none"),
        (3, "cpu", "cpu"),
        (3, "none", "none"),
    ]:
        text = (RECIPES / "tiny-gpt2-cpu.yaml").read_text()
        path = tmp_path / f"zero{stage}-{offload_opt}-{offload_params}.yaml"
        path.write_text(
            text.replace("launcher: torchrun", "launcher: deepspeed").replace(
                "parallelism:\n",
                f"parallelism:\n  zero_stage: {stage}\n  offload_optimizer: {offload_opt}\n"
                f"  offload_params: {offload_params}\n",
            )
        )
        variants.append(path)
    return variants


def test_rendered_configs_pass_deepspeeds_own_checks(deepspeed_comm: None, tmp_path: Path) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    recipes = [p for p in sorted(RECIPES.glob("*.yaml")) if "ds_config.json" in render_job(load_recipe(p)).files]
    assert {p.stem for p in recipes} >= {"llama-7b-zero3-ib", "megatron-3d-24node"}
    for path in recipes + _zero_variants(tmp_path):
        loaded = load_recipe(path)
        config = json.loads(render_job(loaded).files["ds_config.json"])
        dp = loaded.recipe.parallelism.dp
        parsed = DeepSpeedConfig(copy.deepcopy(config), mpu=_DataParallelOnly(dp))
        assert parsed.train_batch_size == loaded.recipe.parallelism.global_batch_size
        assert parsed.zero_optimization_stage == loaded.recipe.parallelism.zero_stage
        wrong = dict(config, train_batch_size=config["train_batch_size"] + dp)
        with pytest.raises(AssertionError):
            DeepSpeedConfig(wrong, mpu=_DataParallelOnly(dp))


def test_zero3_config_saves_a_loadable_model() -> None:
    config = json.loads(render_job(load_recipe(REPO / "recipes" / "llama-7b-zero3-ib.yaml")).files["ds_config.json"])
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True

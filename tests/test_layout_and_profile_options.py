"""Issue 13's layout arithmetic and profile controls: context/expert parallel degrees (validated,
kept by the planner), a ds_config.json for any DeepSpeed-driving script, the neutral network
profile, and a recipe dropping a profile's modules or setup lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.plan.planner import candidate_layouts, shape_of
from conftest import REPO

MEGATRON = REPO / "recipes" / "megatron-3d-24node.yaml"  # 24 nodes x 8 GPUs, tp 4, pp 12, dp 4


def _megatron(tmp_path: Path, **parallelism) -> Path:
    data = yaml.safe_load(MEGATRON.read_text())
    data["cluster"] = str(REPO / "recipes" / "clusters" / "infiniband-a100.yaml")
    data["parallelism"].update(parallelism)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cp_takes_its_share_of_the_world_and_ep_divides_dp(tmp_path: Path) -> None:
    loaded = load_recipe(_megatron(tmp_path, dp="auto", cp=2, ep=2, global_batch_size=None, micro_batch_size=1))
    p = loaded.recipe.parallelism
    assert (p.dp, p.tp, p.pp, p.cp, p.ep) == (2, 4, 12, 2, 2)  # 2*4*12*2 = 192
    # the job reads the degrees it was validated with
    assert json.loads(render_job(loaded).files["job.json"])["recipe"]["parallelism"]["cp"] == 2


@pytest.mark.parametrize(
    "parallelism, message",
    [
        ({"cp": 2}, "parallelism: dp*tp*pp*cp = 4*4*12*2 = 384, but nodes*gpus_per_node = 24*8 = 192"),
        (
            {"dp": "auto", "cp": 5, "global_batch_size": None},
            "parallelism.tp: tp*pp*cp = 240 does not divide the 192 GPUs",
        ),
        ({"ep": 3}, "parallelism.ep: ep=3 must divide dp=4: the experts are spread over the data-parallel ranks"),
    ],
)
def test_degrees_that_do_not_add_up_are_refused(tmp_path: Path, parallelism: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_megatron(tmp_path, **parallelism))
    assert message in str(raised.value)


@pytest.mark.parametrize("degree, what", [("cp", "context"), ("ep", "expert")])
def test_the_built_in_runner_refuses_cp_and_ep(degree: str, what: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(
            REPO / "recipes" / "tiny-gpt2-cpu.yaml", [f"parallelism.{degree}=2", "parallelism.micro_batch_size=4"]
        )
    assert f"parallelism.{degree}: the built-in HF Trainer runner cannot do {what} parallelism" in str(raised.value)


def test_the_planner_keeps_the_recipes_cp_and_ep(tmp_path: Path) -> None:
    recipe = _megatron(tmp_path, dp="auto", cp=2, ep=2)
    data = yaml.safe_load(recipe.read_text())
    data["task"]["model_config"] = {
        "model_type": "gpt2",
        "n_layer": 96,
        "n_head": 96,
        "n_embd": 12288,
        "vocab_size": 50257,
        "n_positions": 2048,
    }
    recipe.write_text(yaml.safe_dump(data))
    loaded = load_recipe(recipe)
    layouts = candidate_layouts(shape_of(loaded), loaded, loaded.recipe.parallelism.global_batch_size)
    assert layouts and all(lay.dp * lay.tp * lay.pp * 2 == 192 and lay.dp % 2 == 0 for lay in layouts)
    assert {(lay.tp, lay.pp) for lay in layouts} >= {(4, 12), (8, 6)}


def test_a_script_can_have_a_ds_config_at_zero_0_under_torchrun() -> None:
    env_contract = REPO / "tests" / "recipes" / "env-contract.yaml"
    assert "ds_config.json" not in render_job(load_recipe(env_contract)).files
    config = json.loads(render_job(load_recipe(env_contract, ["deepspeed.enabled=true"])).files["ds_config.json"])
    assert config["zero_optimization"]["stage"] == 0 and config["train_batch_size"] == 4
    with pytest.raises(RecipeError, match="deepspeed.enabled: ZeRO stage 2 needs DeepSpeed; remove enabled: false"):
        load_recipe(env_contract, ["deepspeed.enabled=false", "parallelism.zero_stage=2"])


def _site_profile(tmp_path: Path, **fields) -> Path:
    data = yaml.safe_load((REPO / "recipes" / "clusters" / "infiniband-h100.yaml").read_text())
    data.update(fields)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _script_recipe(tmp_path: Path, profile: Path, **fields) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "r",
                "cluster": str(profile),
                "resources": {"nodes": 2, "time": "60"},
                "task": {"script": "/shared/train.py"},
                **fields,
            }
        )
    )
    return path


def test_the_neutral_network_profile_sets_nothing_about_the_network(tmp_path: Path) -> None:
    profile = _site_profile(tmp_path)
    env_sh = render_job(load_recipe(_script_recipe(tmp_path, profile, network={"profile": "none"}))).files["env.sh"]
    exported = [
        line.split("=")[0].removeprefix("export ") for line in env_sh.splitlines() if line.startswith("export ")
    ]
    # Threads are about CPUs, the NCCL flight recorder about a hung collective's record: not the network.
    assert [name for name in exported if not name.startswith("TORCH_NCCL_")] == ["OMP_NUM_THREADS"]
    infiniband = render_job(load_recipe(_script_recipe(tmp_path, profile))).files["env.sh"]
    assert "export NCCL_IB_TIMEOUT=22" in infiniband and "export NCCL_" not in env_sh


def test_a_recipe_drops_a_profiles_modules_and_setup_lines(tmp_path: Path) -> None:
    profile = _site_profile(
        tmp_path, modules=["cuda/12.4", "nccl/2.21"], setup=["source /site/env.sh", "ulimit -n 65536"]
    )
    script = render_job(
        load_recipe(
            _script_recipe(
                tmp_path,
                profile,
                drop={"modules": ["nccl/2.21"], "setup": ["source /site/env.sh"]},
                setup=["source /mine.sh"],
            )
        )
    ).files["job.sbatch"]
    assert "module load cuda/12.4\nulimit -n 65536\nsource /mine.sh\n" in script
    assert "nccl/2.21" not in script and "/site/env.sh\n" not in script
    with pytest.raises(RecipeError) as raised:
        load_recipe(_script_recipe(tmp_path, profile, drop={"modules": ["nccl/2.22"]}))
    assert (
        "drop.modules[0]: cluster profile 'infiniband-h100' has no modules entry 'nccl/2.22' "
        "(it has: 'cuda/12.4', 'nccl/2.21')"
    ) in str(raised.value)

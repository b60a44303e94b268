"""Every class of bad input: one line naming file, line and key path; exit code 2; no traceback;
nothing written. And the warnings ops teams rely on."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from clusterkit import RecipeError, load_recipe
from conftest import PORTED_RECIPES, RECIPES, SHIPPED_RECIPES, run_cli

BASE = """\
name: t
resources:
  nodes: 2
  gpus_per_node: 2
  time: "10"
task:
  script: train.py
"""
TRAINER = """\
name: t
resources: {nodes: 2, gpus_per_node: 2, time: "10"}
task:
  trainer:
    model:
      config: {model_type: gpt2, n_layer: 3, n_head: 4, n_embd: 64, vocab_size: 512}
"""


def _write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# (recipe text, expected line, key path, message fragment)
INVALID = [
    pytest.param(BASE + "launcher: deepspeedd\n", 8, "launcher", "Invalid enum value 'deepspeedd'", id="enum"),
    pytest.param(
        BASE.replace("  nodes: 2", "  nodez: 2"), 3, "resources.nodez", "did you mean 'nodes'?", id="unknown-key"
    ),
    pytest.param(
        BASE.replace("  nodes: 2", "  nodes: two"), 3, "resources.nodes", "Expected `int`, got `str`", id="type"
    ),
    pytest.param(BASE.replace("  nodes: 2", "  nodes: 0"), 3, "resources.nodes", ">= 1", id="range"),
    pytest.param(
        BASE + "parallelism: {dp: 3}\n",
        8,
        "parallelism",
        "dp*tp*pp = 3*1*1 = 3, but nodes*gpus_per_node = 2*2 = 4",
        id="world-size",
    ),
    pytest.param(
        BASE + "parallelism: {tp: 4, dp: 1}\n", 8, "parallelism.tp", "must divide gpus_per_node=2", id="tp-across-nodes"
    ),
    pytest.param(
        BASE + "parallelism: {micro_batch_size: 2, gradient_accumulation_steps: 2, global_batch_size: 10}\n",
        8,
        "parallelism.global_batch_size",
        "!= micro_batch_size*gradient_accumulation_steps*dp",
        id="batch-arithmetic",
    ),
    pytest.param(
        BASE + "parallelism: {micro_batch_size: 3, global_batch_size: 16}\n",
        8,
        "parallelism.global_batch_size",
        "not divisible by micro_batch_size*dp = 3*4",
        id="batch-indivisible",
    ),
    pytest.param(
        BASE + "parallelism: {pp: 2, zero_stage: 2}\n", 8, "parallelism.zero_stage", "only stage 1", id="zero-with-pp"
    ),
    pytest.param(
        TRAINER + "parallelism: {pp: 2}\n", 7, "parallelism.pp", "cannot do pipeline parallelism", id="pp-with-trainer"
    ),
    pytest.param(
        BASE + "  model_config: {model_type: gpt2, n_head: 3, n_embd: 96}\nparallelism: {tp: 2}\n",
        8,
        "task.model_config",
        "3 attention heads are not divisible by tp=2",
        id="heads-tp",
    ),
    pytest.param(
        TRAINER + "parallelism: {tp: 2}\n",
        6,
        "task.trainer.model.config",
        "DeepSpeed AutoTP cannot shard gpt2 models",
        id="tp-with-a-trainer-model-autotp-cannot-shard",
    ),
    pytest.param(
        BASE + "parallelism: {zero_stage: 1, offload_params: cpu}\n",
        8,
        "parallelism.offload_params",
        "needs zero_stage: 3",
        id="offload-params-stage",
    ),
    pytest.param(
        BASE + "parallelism: {offload_optimizer: cpu}\n",
        8,
        "parallelism.offload_optimizer",
        "needs ZeRO",
        id="offload-without-zero",
    ),
    pytest.param("name: t\nresources: {time: '10'}\n", 1, "task", "required key 'task' is missing", id="missing-task"),
    pytest.param(
        BASE + "  trainer: {model: {pretrained: gpt2}}\n", 6, "task", "exactly one of task.trainer", id="two-tasks"
    ),
    pytest.param(
        BASE + "cluster: infiniband-h10\n", 8, "cluster", "did you mean 'infiniband-h100'?", id="unknown-cluster"
    ),
    pytest.param(BASE + "resources: {nodes: 1}\n", 8, "resources", "duplicate key", id="duplicate-key"),
    pytest.param(BASE + "env: [oops\n", 9, "<top level>", "invalid YAML", id="yaml-syntax"),
    pytest.param(BASE.replace("name: t", "name: 'a b/../c'"), 1, "name", "letters, digits", id="bad-name"),
    pytest.param(
        BASE + "env: {'1BAD': x}\n", 8, "env", "letters, digits and '_' only, not starting with a digit", id="env-name"
    ),
    pytest.param(
        BASE + "setup: []\nresourcez: {nodes: 1}\n", 9, "resourcez", "did you mean 'resources'?", id="unknown-top-key"
    ),
    pytest.param(
        BASE.replace('  time: "10"', '  partition: "gpu\\n#SBATCH --x"'),
        5,
        "resources.partition",
        "single line",
        id="newline-in-sbatch-value",
    ),
    pytest.param(
        TRAINER + "    args: {per_device_train_batch_size: 8}\n",
        7,
        "task.trainer.args.per_device_train_batch_size",
        "parallelism.micro_batch_size",
        id="trainer-owned-arg",
    ),
    pytest.param(
        TRAINER + "    args: {ddp_timeout: 60}\n",
        7,
        "task.trainer.args.ddp_timeout",
        "collective_timeout",
        id="trainer-ddp-timeout-is-collective-timeout",
    ),
    pytest.param(BASE + "watchdog: {no_progress: 0s}\n", 8, "watchdog.no_progress", "30s, 15m, 2h", id="watchdog-zero"),
    pytest.param(
        BASE + "watchdog: {no_progress: 15m, startup: 5 min}\n", 8, "watchdog.startup", "90, 30s", id="watchdog-unit"
    ),
    pytest.param(
        BASE + "watchdog: {no_progress: 15m, action: kill}\n",
        8,
        "watchdog.action",
        "Invalid enum",
        id="watchdog-action",
    ),
    pytest.param(BASE + "watchdog: {}\n", 8, "watchdog.no_progress", "required", id="watchdog-needs-no-progress"),
]


@pytest.mark.parametrize("text,line,key,fragment", INVALID)
def test_invalid_recipe_gives_one_line_error(tmp_path: Path, text: str, line: int, key: str, fragment: str) -> None:
    recipe = _write(tmp_path, text)
    out = tmp_path / "out"
    done = run_cli("render", str(recipe), "-o", str(out))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    errors = done.stderr.strip().splitlines()
    assert len(errors) >= 1
    first = next(e for e in errors if not e.split(": ", 1)[1].startswith("warning"))
    assert first.startswith(f"{recipe}:{line}: {key}: "), first
    assert fragment in first, first
    assert not out.exists(), "no output may be written for a bad recipe"


def test_validation_error_from_a_base_recipe_names_the_base(tmp_path: Path) -> None:
    _write(tmp_path, "resources:\n  nodes: 2\n  gpus_per_node: 2\n  cpus_per_tsk: 4\n", "base.yaml")
    recipe = _write(tmp_path, "extends: base.yaml\nname: t\ntask: {script: x.py}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    assert str(caught.value).startswith(f"{tmp_path / 'base.yaml'}:4: resources.cpus_per_tsk: unknown key")
    assert "did you mean 'cpus_per_task'?" in str(caught.value)


def test_extends_deep_merges_and_recipe_wins(tmp_path: Path) -> None:
    _write(tmp_path, "resources: {nodes: 4, gpus_per_node: 2, time: '30'}\nenv: {A: base, B: base}\n", "base.yaml")
    _write(tmp_path, "extends: base.yaml\nenv: {B: mid}\n", "mid.yaml")
    recipe = _write(
        tmp_path, "extends: [mid.yaml]\nname: t\nresources: {nodes: 2}\nenv: {C: top}\ntask: {script: x.py}\n"
    )
    loaded = load_recipe(recipe)
    assert loaded.recipe.resources.nodes == 2 and loaded.recipe.resources.time == "30"
    assert loaded.recipe.env == {"A": "base", "B": "mid", "C": "top"}


def test_extends_cycle_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "extends: b.yaml\n", "a.yaml")
    _write(tmp_path, "extends: a.yaml\n", "b.yaml")
    done = run_cli("validate", str(tmp_path / "a.yaml"))
    assert done.returncode == 2 and "circular extends" in done.stderr and "Traceback" not in done.stderr


def test_set_overrides_and_their_errors(tmp_path: Path) -> None:
    recipe = _write(tmp_path, BASE)
    loaded = load_recipe(recipe, ["resources.nodes=4", "parallelism.micro_batch_size=2", "env.X=1"])
    assert loaded.recipe.resources.nodes == 4 and loaded.recipe.parallelism.global_batch_size == 16
    done = run_cli("validate", str(recipe), "--set", "resources.nodez=4")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "--set resources.nodez=4: resources.nodez: unknown key 'nodez'; did you mean 'nodes'?"
    )
    done = run_cli("validate", str(recipe), "--set", "resources.nodes")
    assert done.returncode == 2 and "expected key.path=value" in done.stderr


def test_derived_layout_and_batches(tmp_path: Path) -> None:
    loaded = load_recipe(
        _write(tmp_path, BASE + "parallelism: {global_batch_size: 32, gradient_accumulation_steps: 2}\n")
    )
    p = loaded.recipe.parallelism
    assert (p.dp, p.micro_batch_size, p.gradient_accumulation_steps, p.global_batch_size) == (4, 4, 2, 32)
    assert loaded.recipe.precision == "fp32"  # the dev profile is CPU-only
    assert loaded.recipe.network.profile == "loopback"


def test_many_errors_in_one_recipe_are_all_reported(tmp_path: Path) -> None:
    recipe = _write(tmp_path, BASE + "parallelism: {dp: 3, zero_stage: 3, pp: 1, offload_optimizer: nvme}\n")
    done = run_cli("validate", str(recipe))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert any("dp*tp*pp" in line for line in lines) and any("nvme_path" in line for line in lines)
    assert all(re.match(r"^\S+:\d+: ", line) for line in lines)


@pytest.mark.parametrize(
    "text,fragment",
    [
        (BASE.replace('  time: "10"\n', ""), "resources.time: no time limit set"),
        (BASE.replace('"10"', '"3:00:00"'), "resources.time: 3:00:00 is above cluster 'dev' max_time 1:00:00"),
        (BASE + "launcher: deepspeed\n", "launcher: the DeepSpeed launcher without ZeRO"),
        (BASE + "env: {NCCL_DEBUG: INFO}\n", "env.NCCL_DEBUG: NCCL_DEBUG=INFO is a debugging setting"),
    ],
)
def test_warnings(tmp_path: Path, text: str, fragment: str) -> None:
    recipe = _write(tmp_path, text)
    done = run_cli("validate", str(recipe))
    assert done.returncode == 0, done.stderr
    assert f"warning: {fragment}" in done.stderr


def test_validate_a_whole_folder(tmp_path: Path) -> None:
    good = RECIPES / "tiny-gpt2-cpu.yaml"
    (tmp_path / "good.yaml").write_text(good.read_text())
    _write(tmp_path, BASE.replace("nodes: 2", "nodes: -1"), "bad.yaml")
    done = run_cli("validate", str(tmp_path))
    assert done.returncode == 2
    assert "good.yaml: ok" in done.stdout and "1 of 2 recipes valid" in done.stdout
    assert f"{tmp_path / 'bad.yaml'}:3: resources.nodes" in done.stderr


def test_shipped_recipes_all_validate() -> None:
    done = run_cli("validate", str(RECIPES))
    assert done.returncode == 0, done.stderr
    count = len(SHIPPED_RECIPES) + len(PORTED_RECIPES)
    assert count >= 24 and f"{count} of {count} recipes valid" in done.stdout


def test_missing_recipe_file(tmp_path: Path) -> None:
    done = run_cli("render", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and done.stderr.strip() == f"{tmp_path / 'nope.yaml'}: <top level>: file not found"


def test_pp_reported_with_the_runner_limit_and_uneven_stages_are_no_error(tmp_path: Path) -> None:
    recipe = _write(tmp_path, TRAINER + "parallelism: {pp: 2}\n")  # the model has 3 layers
    done = run_cli("validate", str(recipe))
    assert done.returncode == 2
    assert "parallelism.pp: the built-in HF Trainer runner cannot do pipeline parallelism" in done.stderr
    assert "layers" not in done.stderr  # uneven stages are only a warning (tests/test_launch_options.py)

"""The resolved recipe: what every rank decodes from job.json is exactly what the loader resolved,
every derived value is set, and the layout properties agree with the numbers the job is given."""

from __future__ import annotations

import typing
from pathlib import Path

import msgspec
import pytest

from clusterkit import load_recipe, render_job
from clusterkit.load.loader import base_recipes
from clusterkit.spec.resolved import JobFile, ResolvedParallelism, ResolvedResources, decode_job_file
from conftest import RECIPES, SHIPPED_RECIPES

JOB_RECIPES = [r for r in SHIPPED_RECIPES if r not in base_recipes(SHIPPED_RECIPES)]


@pytest.mark.parametrize("recipe", JOB_RECIPES, ids=lambda p: p.stem)
def test_job_json_decodes_to_the_loaded_resolved_recipe(recipe: Path) -> None:
    loaded = load_recipe(recipe)
    job = decode_job_file(render_job(loaded).files["job.json"])
    assert job == JobFile(recipe=loaded.recipe, profile=loaded.profile)
    assert job.recipe.world_size == loaded.recipe.resources.nodes * loaded.recipe.resources.gpus_per_node


@pytest.mark.parametrize("struct", [ResolvedResources, ResolvedParallelism])
def test_derived_values_are_never_optional(struct: type) -> None:
    hints = typing.get_type_hints(struct)
    derived = {
        "gpus_per_node",
        "cpus_per_task",
        "dp",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "global_batch_size",
    }
    for name in derived & set(hints):
        assert hints[name] is int, f"{struct.__name__}.{name} is {hints[name]}"


def test_open_fields_are_filled_and_properties_follow_the_layout(tmp_path: Path) -> None:
    # Everything but the name, the task and the global batch is left to the profile and the derivation.
    written = tmp_path / "open.yaml"
    written.write_text(
        "name: open\nparallelism: {global_batch_size: 12}\n"
        "task: {trainer: {model: {config: {model_type: gpt2, n_layer: 1, n_head: 2, n_embd: 8}}}}\n"
    )
    loaded = load_recipe(written, ["parallelism.micro_batch_size=3"])
    recipe, profile = loaded.recipe, loaded.profile
    assert recipe.resources.gpus_per_node == recipe.ranks_per_node == profile.gpus_per_node == 2
    assert recipe.resources.cpus_per_task == profile.cpus_per_node
    assert recipe.world_size == recipe.parallelism.dp == 2
    p = recipe.parallelism
    assert (p.micro_batch_size, p.gradient_accumulation_steps, p.global_batch_size) == (3, 2, 12)
    assert recipe.python == ["python3"] and recipe.network.profile == profile.interconnect
    assert recipe.precision == "fp32" and recipe.preflight.enabled is False
    assert recipe.uses_deepspeed is False
    zero = load_recipe(RECIPES / "tiny-gpt2-cpu.yaml", ["parallelism.zero_stage=2"]).recipe
    launcher = load_recipe(RECIPES / "tiny-gpt2-cpu.yaml", ["launcher=deepspeed"]).recipe
    assert zero.uses_deepspeed and launcher.uses_deepspeed


def test_job_json_with_a_missing_or_mistyped_value_is_refused() -> None:
    loaded = load_recipe(RECIPES / "tiny-gpt2-cpu.yaml")
    job = msgspec.to_builtins(JobFile(recipe=loaded.recipe, profile=loaded.profile))
    job["recipe"]["parallelism"]["dp"] = "auto"
    with pytest.raises(msgspec.ValidationError, match=r"recipe.parallelism.dp"):
        decode_job_file(msgspec.json.encode(job))
    del job["recipe"]["resources"]["gpus_per_node"]
    job["recipe"]["parallelism"]["dp"] = 4
    with pytest.raises(msgspec.ValidationError, match="gpus_per_node"):
        decode_job_file(msgspec.json.encode(job))


def test_the_runner_reads_job_json_without_the_loader() -> None:
    """What every rank imports to read job.json stays light: no YAML, templates or loader."""
    import subprocess
    import sys

    code = (
        "import sys, clusterkit.spec.resolved; "
        "print(sorted({'yaml', 'jinja2', 'clusterkit.load.loader', 'clusterkit.render.job'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=RECIPES.parent)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr

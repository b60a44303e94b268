"""The launch plan's tables are views of what it writes, not copies kept by hand: every flag a
launcher record writes is one the recipe checks refuse in launcher_args, every srun option the
supervisor writes is one srun.extra may not set, every #SBATCH option the header writes is one
extra_sbatch may not set; and each count comes from the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterkit import load_recipe, render_job
from clusterkit.spec.launch_plan import launch_plan
from clusterkit.spec.launchers import LAUNCHERS, Program, Words
from clusterkit.spec.sbatch_header import WRITTEN, header_options
from clusterkit.spec.step_options import STEP_LAYOUT, STEP_OWNED
from clusterkit.supervisor import steps
from conftest import RECIPES
from launch_plans import plan_of

TINY = RECIPES / "tiny-gpt2-cpu.yaml"
PROGRAM = Program(Words().add("train.py"), False, Words().add("--data", "x"))


def _flag(word: str) -> str:
    return word.lstrip("-").split("=", 1)[0].replace("_", "-")


def _loaded(launcher: str):
    """The tiny recipe under ``launcher``: a script for a command, a program for srun, one CPU per rank's task."""
    overrides = [f"launcher={launcher}", "resources.cpus_per_task=1"]
    if launcher in ("command", "ray"):  # ray: a script, its driver
        overrides += ["task={script: train.py}"]
    if launcher == "srun":
        overrides += ["task={program: ./train}"]
    return load_recipe(TINY, overrides)


def _recipe(launcher: str):
    return _loaded(launcher).recipe


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_every_flag_a_launcher_writes_is_one_it_owns(name: str) -> None:
    launcher = LAUNCHERS[name]
    recipe = _recipe(name)
    commands = [build(recipe, PROGRAM) for build in (launcher.command, launcher.batch_command) if build]
    assert commands, name
    for command in commands:
        written = {_flag(word) for word in command.words if word.startswith("-") and word not in ("-m", "-u", "-c")}
        written -= {"data"}  # the program's own argument
        mine = set(launcher.owned) | launcher.defaults
        assert written <= mine, (name, sorted(written - mine))


def test_the_recipe_launcher_type_is_the_records() -> None:
    from clusterkit.spec.recipe import Launcher

    assert set(Launcher.__args__) == set(LAUNCHERS)  # type: ignore[attr-defined]


def test_the_step_layout_is_what_the_supervisor_writes() -> None:
    plan = plan_of(render_job(load_recipe(TINY)))
    argv = steps.srun_argv(plan, plan.launch, ["a", "b"], "/r", {}, ["python3"])
    layout = {_flag(word) for word in argv[1 : argv.index("python3")] if word.startswith("--")} - {
        _flag(word) for word in plan.launch.srun
    }
    assert layout == set(STEP_LAYOUT)
    assert {_flag(word) for word in plan.launch.srun} <= set(STEP_OWNED)


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_header_option_clusterkit_writes_is_in_its_table(recipe: Path) -> None:
    loaded = load_recipe(recipe)
    written = {flag for flag, _ in header_options(loaded.recipe, loaded.profile)}
    assert written - set(loaded.recipe.resources.extra_sbatch) <= set(WRITTEN)


@pytest.mark.parametrize("launcher", ["torchrun", "python", "command", "deepspeed"])
def test_every_count_comes_from_the_plan(launcher: str) -> None:
    """#SBATCH --nodes/--ntasks-per-node and the launch step's layout agree, whatever the launcher."""
    loaded = _loaded(launcher)
    plan = launch_plan(loaded.recipe, loaded.profile)
    header = dict(header_options(loaded.recipe, loaded.profile))
    assert header["nodes"] == plan.train_nodes + plan.service_nodes == plan.launch.nodes
    assert header["ntasks-per-node"] == plan.launch.tasks_per_node
    assert plan.launch.ntasks == (loaded.recipe.world_size if launcher == "python" else plan.launch.nodes)

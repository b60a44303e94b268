"""clusterkit import of heterogeneous jobs: ``#SBATCH hetjob`` groups after the first are components'
resources (never the job's), a hand-written script's ``srun --het-group=N`` lines their commands,
and what no component field holds is listed with its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterkit.cli.scaffold import checked
from clusterkit.load.import_script import import_script
from clusterkit.load.import_yaml import recipe_yaml
from clusterkit.load.script_compare import differences, script_parts
from clusterkit.load.script_text import parse_script, read_script

HAND_WRITTEN = """#!/bin/bash
#SBATCH --job-name=rlhf --nodes=2 --gres=gpu:8 --ntasks-per-node=1 --time=12:00:00 --partition=gpu
#SBATCH hetjob
#SBATCH --nodes=1 --ntasks-per-node=2 --gres=gpu:a100:2 -c 16 -p a100 --mem=200G --constraint=a100_80g
#SBATCH --mail-user=me@x.org
#SBATCH packjob
#SBATCH -N 1 --gpus-per-node=8
export NCCL_DEBUG=WARN
REWARD_BATCH=64 srun --het-group=1 --label --cpu-bind=none --nodes=1 python3 -m reward_server --port 8000 > r.log &
srun --het-group=2 --export=ALL,X=1 vllm serve /shared/models/policy --port 8100 &
sleep 60
srun --het-group=0 torchrun --nnodes=2 --nproc-per-node=8 train_ppo.py --lr 1e-5
wait
"""


def _imported(text: str):  # noqa: ANN202 - Imported
    return import_script(parse_script(text, "job.sh"))


def test_the_later_header_groups_are_components_never_the_jobs() -> None:
    imported = _imported(HAND_WRITTEN)
    resources = imported.recipe["resources"]
    assert (resources["nodes"], resources["gpus_per_node"], resources["partition"]) == (2, 8, "gpu")
    assert "mem" not in resources and "constraint" not in resources and "extra_sbatch" not in resources
    assert imported.recipe["launcher"] == "torchrun"
    assert imported.recipe["task"]["script"] == "train_ppo.py"
    reward, generator = imported.recipe["components"]
    assert reward == {
        "name": "reward_server",
        "command": ["python3", "-m", "reward_server", "--port", "8000"],
        "nodes": 1, "ranks_per_node": 2, "gpus_per_node": 2, "cpus_per_task": 16, "partition": "a100",
        "sbatch": {"mem": "200G", "constraint": "a100_80g"},
        "srun": {"label": True, "cpu-bind": "none"},
        "env": {"REWARD_BATCH": "64"},
    }  # fmt: skip
    assert generator == {
        "name": "vllm", "command": ["vllm", "serve", "/shared/models/policy", "--port", "8100"],
        "nodes": 1, "gpus_per_node": 8,
    }  # fmt: skip


def test_what_no_component_field_holds_is_listed_with_its_line() -> None:
    listed = {(u.line, u.text): u for u in _imported(HAND_WRITTEN).unmapped}
    assert "job-wide" in listed[(5, "--mail-user=me@x.org")].why
    assert listed[(9, "srun --nodes=1")].nearest == "components[0].nodes"
    assert listed[(9, "> r.log")].nearest == "runs_dir"
    assert listed[(10, "srun --export=ALL,X=1")].nearest == "components[1].env"
    ports = [u for (line, _), u in listed.items() if line in (9, 10) and "port" in u.nearest]
    assert [u.nearest for u in ports] == ["components[0].port", "components[1].port"]
    assert not any(u.line in (9, 10) and "another step" in u.why for u in listed.values())


def test_a_group_without_its_srun_line_is_listed_with_the_fields_to_write() -> None:
    imported = _imported("#SBATCH -N 2 --gres=gpu:8\n#SBATCH hetjob\n#SBATCH -N 3 -p cpu\nsrun python t.py\n")
    (component,) = imported.recipe["components"]
    assert (component["nodes"], component["partition"], component["command"]) == (3, "cpu", ["true"])
    (listed,) = [u for u in imported.unmapped if u.line == 2]
    assert listed.nearest == "components[0].command" and "het group 1" in listed.why
    assert imported.recipe["resources"]["nodes"] == 2


def test_a_hand_written_hetjob_imports_to_a_recipe_that_renders_its_groups(tmp_path: Path) -> None:
    imported = _imported(HAND_WRITTEN)
    files, _ = checked(recipe_yaml(imported, "job.sh", "infiniband-h100"), None, folder=tmp_path)
    original = script_parts(parse_script(HAND_WRITTEN, "job.sh"))
    found = differences(original, script_parts(parse_script(files["job.sbatch"], "job.sbatch")))
    # Only the listed job-wide option, and what the render spells its own way (the GPU type is the
    # profile's, a per-node GPU count as --gres, the defaults written out) differ in the groups.
    assert [line for line in found if "het group" in line] == [
        "header --gpus-per-node (het group 2): only in the script (8)",
        "header --gres (het group 1): gpu:a100:2 -> gpu:2",
        "header --gres (het group 2): only in the render (gpu:8)",
        "header --mail-user (het group 1): only in the script (me@x.org)",
        "header --ntasks-per-node (het group 2): only in the render (1)",
        "header --partition (het group 2): only in the render (gpu)",
    ]


def test_a_component_line_over_several_lines_or_with_control_characters_is_listed_not_run() -> None:
    text = "#SBATCH -N 2\n#SBATCH hetjob\n#SBATCH -N 1\nsrun --het-group=1 bash -c 'serve\nmore' &\nsrun python t.py\n"
    imported = _imported(text)
    (component,) = imported.recipe["components"]
    assert component["command"] == ["true"]
    assert any(u.line == 4 and "several lines" in u.why for u in imported.unmapped)


@pytest.mark.parametrize(
    "components",
    [
        [{"name": "x", "port": None, "ready_timeout_s": 5, "step": {"het_group": 0, "argv": ["a"], "srun": [], "env": {}}}],
        [{"name": "x", "port": None, "ready_timeout_s": 5, "step": {"het_group": 9, "argv": ["a"], "srun": [], "env": {}}}],
        [{"name": "x"}],
        "not a list",
        [{"name": "x", "port": None, "ready_timeout_s": 5, "step": {"het_group": 1, "argv": "a", "srun": 1, "env": []}}],
    ],
    ids=["group-0", "group-9", "no-step", "text", "wrong-types"],
)  # fmt: skip
def test_a_tampered_plan_json_is_listed_never_a_traceback(tmp_path: Path, components: object) -> None:
    job = tmp_path / "job.sbatch"
    recipe = Path(__file__).resolve().parent.parent / "recipes" / "hetjob-rlhf-reward.yaml"
    from clusterkit import api

    files = api.render_job(api.load_recipe(recipe)).files
    job.write_text(files["job.sbatch"])
    plan = json.loads(files["plan.json"])
    plan["components"] = components
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    imported = import_script(read_script(job))
    assert any("plan" in u.why and u.nearest == "components:" for u in imported.unmapped)
    assert imported.recipe["resources"]["nodes"] == 2


def test_a_hetjob_line_first_or_last_in_the_header_is_an_empty_group() -> None:
    imported = _imported("#SBATCH hetjob\n#SBATCH -N 3\n#SBATCH hetjob\nsrun python t.py\n")
    first, second = imported.recipe["components"]
    assert (first["nodes"], "nodes" in second) == (3, False)
    assert "nodes" not in imported.recipe["resources"]
    assert [u.line for u in imported.unmapped if u.nearest.endswith(".command")] == [1, 3]


def test_a_component_steps_log_options_point_at_the_run_directory() -> None:
    imported = _imported(
        "#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 1\nsrun --het-group=1 -o x.log --open-mode=append -n 4 s &\n"
    )
    nearest = {u.text: u.nearest for u in imported.unmapped if u.line == 4}
    assert nearest["srun --output=x.log"].startswith("runs_dir")
    assert nearest["srun --open-mode=append"].startswith("nothing")
    assert nearest["srun --ntasks=4"] == "components[0].nodes and ranks_per_node"


def test_a_component_steps_variable_the_job_sets_itself_is_listed_not_taken() -> None:
    text = "#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 1\nRANK=3 SLURM_X=1 B=2 srun --het-group=1 s &\nsrun python t.py\n"
    imported = _imported(text)
    assert imported.recipe["components"][0]["env"] == {"B": "2"}
    assert sorted(u.text for u in imported.unmapped if u.line == 4 and u.why.startswith("set by")) == [
        "RANK=3", "SLURM_X=1"
    ]  # fmt: skip

"""Small validation errors found porting real public launch scripts (issue 31, item 8): options SLURM
takes that the checks refused or warned about, and errors that did not name their fix. Each finding
is one line, `file:line: key: message`, asserted whole."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.errors import RecipeError
from clusterkit.load.slurm_options import SRUN_OPTIONS
from clusterkit.render.job import sbatch_options
from conftest import REPO

SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")
SRUN_MAN = Path("/usr/share/man/man1/srun.1.gz")


def _recipe(tmp_path: Path, **fields) -> Path:
    """A two-node script recipe on the dev profile (2 stand-in GPUs per node, no mem_per_node), a
    field a line (JSON is YAML): resources: is line 1, the other fields follow from line 5."""
    body = {
        "resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"},
        "name": "port",
        "cluster": "dev",
        "task": {"script": SCRIPT},
    }
    for name, value in fields.items():
        if name == "resources":
            body["resources"] = {**body["resources"], **value}
        else:
            body[name] = value
    path = tmp_path / "port.yaml"
    path.write_text("".join(f"{name}: {json.dumps(value)}\n" for name, value in body.items()))
    return path


def _errors(path: Path, *overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as raised:
        load_recipe(path, list(overrides))
    return str(raised.value).splitlines()


def _warnings(path: Path, *overrides: str) -> list[str]:
    return [str(w).replace(": warning: ", ": ", 1) for w in load_recipe(path, list(overrides)).warnings]


# 1. --mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive: refused only beside one written.
def test_mem_per_gpu_is_taken_where_no_mem_is_written(tmp_path: Path) -> None:
    loaded = load_recipe(_recipe(tmp_path, resources={"extra_sbatch": {"mem-per-gpu": "55G"}}))
    options = dict(sbatch_options(loaded))
    assert options["mem-per-gpu"] == "55G" and "mem" not in options and not loaded.warnings


@pytest.mark.parametrize(
    "resources, flag, message",
    [
        (
            {"mem": "100G", "extra_sbatch": {"mem-per-gpu": "55G"}},
            "mem-per-gpu",
            "--mem-per-gpu and the --mem=100G clusterkit writes from resources.mem are mutually exclusive in "
            "SLURM; keep one of them",
        ),
        (
            {"mem": "100G", "extra_sbatch": {"mem-per-cpu": "4G"}},
            "mem-per-cpu",
            "--mem-per-cpu and the --mem=100G clusterkit writes from resources.mem are mutually exclusive in "
            "SLURM; keep one of them",
        ),
        (
            {"extra_sbatch": {"mem-per-cpu": "4G", "mem-per-gpu": "55G"}},
            "mem-per-gpu",
            "--mem-per-gpu and --mem-per-cpu are mutually exclusive in SLURM; keep one of them",
        ),
    ],
)
def test_mem_per_gpu_beside_a_written_mem_is_one_line(tmp_path: Path, resources: dict, flag: str, message: str) -> None:
    path = _recipe(tmp_path, resources=resources)
    assert _errors(path) == [f"{path}:1: resources.extra_sbatch.{flag}: {message}"]


def test_mem_per_gpu_beside_the_profiles_mem_per_node_is_refused(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({**profile, "name": "site", "mem_per_node": "64G"}))
    path = _recipe(tmp_path, cluster=str(tmp_path / "site.yaml"), resources={"extra_sbatch": {"mem-per-gpu": "8G"}})
    assert _errors(path) == [
        f"{path}:1: resources.extra_sbatch.mem-per-gpu: --mem-per-gpu and the --mem=64G clusterkit writes from "
        "the cluster profile's mem_per_node are mutually exclusive in SLURM; give the memory per node in resources.mem instead"
    ]


# 2. srun options SLURM documents (srun(1) of 22.05) are known, not warned about.
@pytest.mark.parametrize("flag, value", [("accel-bind", "gn"), ("msg-timeout", 30), ("x11", "first"), ("hold", True)])
def test_documented_srun_options_are_not_warned_about(tmp_path: Path, flag: str, value: object) -> None:
    assert _warnings(_recipe(tmp_path, srun={"extra": {flag: value}})) == []


def test_an_sbatch_only_option_in_srun_extra_is_warned_about(tmp_path: Path) -> None:
    path = _recipe(tmp_path, srun={"extra": {"wrap": "x"}})
    assert _warnings(path) == [
        f"{path}:5: srun.extra.wrap: --wrap is not an srun option SLURM documents; srun will fail unless a "
        "site plugin adds it"
    ]


def test_srun_only_options_stay_refused_in_extra_sbatch(tmp_path: Path) -> None:
    path = _recipe(tmp_path, resources={"extra_sbatch": {"accel-bind": "gn"}})
    assert _errors(path) == [
        f"{path}:1: resources.extra_sbatch.accel-bind: --accel-bind is an srun option, not an sbatch one; "
        "set it for the launch step under srun.extra"
    ]


# 3. gpus-per-task: its value must be the GPUs each srun task of the layout has.
@pytest.mark.parametrize(
    "fields, value",
    [
        ({}, 2),  # torchrun: one launcher task per node, with the node's 2 GPUs
        ({"resources": {"gpus_per_node": 1}}, 1),
        ({"launcher": "python"}, 1),  # a task per GPU
    ],
)
def test_gpus_per_task_matching_the_tasks_gpus_is_taken(tmp_path: Path, fields: dict, value: int) -> None:
    fields = {**fields, "resources": {**fields.get("resources", {}), "extra_sbatch": {"gpus-per-task": value}}}
    loaded = load_recipe(_recipe(tmp_path, **fields))
    assert ("gpus-per-task", value) in sbatch_options(loaded)


@pytest.mark.parametrize(
    "fields, value, message",
    [
        (
            {},
            1,
            "one launcher task per node (launcher torchrun) starts the node's 2 ranks and needs its 2 GPUs: "
            "gpus-per-task must be 2, or leave it out",
        ),
        (
            {"launcher": "python"},
            2,
            "a task per GPU (launcher: python) binds one GPU to each task: gpus-per-task must be 1",
        ),
        (
            {"launcher": "deepspeed", "process_model": "batch_launcher", "parallelism": {"zero_stage": 1}},
            1,
            "launcher deepspeed starts the node's 2 ranks itself and hands each its GPU; per-task GPUs would "
            "hide the others from it: set resources.gpus_per_node",
        ),
    ],
)
def test_gpus_per_task_that_conflicts_is_one_line(tmp_path: Path, fields: dict, value: int, message: str) -> None:
    fields = {**fields, "resources": {"extra_sbatch": {"gpus-per-task": value}}}
    path = _recipe(tmp_path, **fields)
    assert _errors(path) == [f"{path}:1: resources.extra_sbatch.gpus-per-task: {message}"]


# 4. A deepspeed.config at ZeRO-0: the error names deepspeed.enabled: true.
def test_a_zero_0_deepspeed_config_error_names_enabled_true(tmp_path: Path) -> None:
    path = _recipe(tmp_path, deepspeed={"config": {"bf16": {"enabled": True}}})
    assert _errors(path) == [
        f"{path}:5: deepspeed.config: a DeepSpeed config needs DeepSpeed in the job: set deepspeed.enabled: true "
        "(a script driving DeepSpeed at ZeRO-0), zero_stage >= 1 or launcher: deepspeed"
    ]
    assert load_recipe(path, ["deepspeed.enabled=true"]).recipe.deepspeed.enabled is True


def test_a_deepspeed_config_with_enabled_false_says_so(tmp_path: Path) -> None:
    path = _recipe(tmp_path, deepspeed={"enabled": False, "config": {"bf16": {"enabled": True}}})
    assert _errors(path) == [
        f"{path}:5: deepspeed.config: deepspeed.enabled is false, so this config is never read; remove one of them"
    ]


# 5. extra_sbatch wait: sbatch's --wait, not an abbreviation of --wait-all-nodes.
def test_extra_sbatch_wait_points_to_srun_wait(tmp_path: Path) -> None:
    path = _recipe(tmp_path, resources={"extra_sbatch": {"wait": 30}})
    assert _errors(path) == [
        f"{path}:1: resources.extra_sbatch.wait: --wait makes sbatch block until the job ends, which a "
        "clusterkit submit must not do; for srun's --wait (seconds to wait for the other tasks once one "
        "exits) set srun.wait"
    ]


def test_a_prefix_of_wait_all_nodes_is_still_an_abbreviation(tmp_path: Path) -> None:
    path = _recipe(tmp_path, resources={"extra_sbatch": {"wait-all": 1}})
    assert _errors(path) == [
        f"{path}:1: resources.extra_sbatch.wait-all: --wait-all abbreviates --wait-all-nodes (sbatch accepts "
        "prefixes); write the full option name"
    ]


# 6. CUDA_VISIBLE_DEVICES: a script that orders the GPUs itself may set it, with a warning.
CUDA_WARNING = (
    "CUDA_VISIBLE_DEVICES replaces the GPU list SLURM binds to each task: every rank of a node sees this "
    "same list, in this order"
)


def test_cuda_visible_devices_in_env_is_a_warning(tmp_path: Path) -> None:
    path = _recipe(tmp_path, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert _warnings(path) == [f"{path}:5: env.CUDA_VISIBLE_DEVICES: {CUDA_WARNING}"]


@pytest.mark.parametrize("fields", [{"secrets": ["CUDA_VISIBLE_DEVICES"]}, {"env": {"SLURM_NTASKS": "2"}}])
def test_other_owned_names_stay_refused(tmp_path: Path, fields: dict) -> None:
    errors = _errors(_recipe(tmp_path, **fields))
    assert len(errors) == 1 and " is set by " in errors[0], errors


@pytest.mark.skipif(not SRUN_MAN.exists(), reason="no srun(1) man page here")
def test_every_option_srun_documents_is_known() -> None:
    """The list is srun(1)'s: each entry of the man page installed here is in it."""
    text = gzip.open(SRUN_MAN, "rt").read()
    documented = {
        name.replace("\\-", "-")
        for name in re.findall(r"^\\fB(?:\\-[A-Za-z]\\fR, \\fB)?\\-\\-([a-z0-9]+(?:\\-[a-z0-9]+)*)", text, re.M)
    }
    assert len(documented) > 100 and documented - {"help"} <= SRUN_OPTIONS


def test_cuda_visible_devices_where_slurm_hands_out_the_gpus_is_refused(tmp_path: Path) -> None:
    """With gres (or --gpus-per-node) SLURM sets the list in every step: the value would be replaced
    as the ranks start, so the recipe would not be the job that runs."""
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    (tmp_path / "site.yaml").write_text(
        yaml.safe_dump({**profile, "name": "site", "accelerator": "gpu", "gpu_request": "gres"})
    )
    path = _recipe(tmp_path, cluster=str(tmp_path / "site.yaml"), env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert _errors(path) == [
        f"{path}:5: env.CUDA_VISIBLE_DEVICES: SLURM sets CUDA_VISIBLE_DEVICES in every step of a cluster whose "
        "GPUs it hands out (gpu_request: gres), so this value would never reach the ranks; order the GPUs in "
        "the script"
    ]


def test_false_removes_a_memory_option_so_nothing_conflicts(tmp_path: Path) -> None:
    loaded = load_recipe(_recipe(tmp_path, resources={"mem": "100G", "extra_sbatch": {"mem-per-gpu": False}}))
    options = dict(sbatch_options(loaded))
    assert options["mem"] == "100G" and "mem-per-gpu" not in options


@pytest.mark.parametrize("flag, full", [("gpus-per-t", "gpus-per-task"), ("mem-per-g", "mem-per-gpu")])
def test_prefixes_of_the_checked_options_stay_refused(tmp_path: Path, flag: str, full: str) -> None:
    """sbatch would read them as the full option, past the checks above."""
    path = _recipe(tmp_path, resources={"extra_sbatch": {flag: 1}})
    assert _errors(path) == [
        f"{path}:1: resources.extra_sbatch.{flag}: --{flag} abbreviates --{full} (sbatch accepts prefixes); "
        "write the full option name"
    ]


def test_srun_extra_wait_points_to_its_field(tmp_path: Path) -> None:
    path = _recipe(tmp_path, srun={"extra": {"wait": 30}})
    assert _errors(path) == [
        f"{path}:5: srun.extra.wait: --wait is given to the launch step by clusterkit; set srun.wait instead"
    ]


def test_a_profile_cannot_set_cuda_visible_devices(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    (tmp_path / "site.yaml").write_text(
        yaml.safe_dump({**profile, "name": "site", "env": {"CUDA_VISIBLE_DEVICES": "0"}})
    )
    errors = _errors(_recipe(tmp_path, cluster=str(tmp_path / "site.yaml")))
    assert len(errors) == 1 and "env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by SLURM" in errors[0], errors

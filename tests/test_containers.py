"""Containers (issue 14): pyxis/enroot and Apptainer per profile, the image per recipe, the run
directory always mounted at its own path, and a check that the image holds what the launch runs.

Apptainer is not a Debian package, so the end-to-end test runs a STAND-IN (tests/scripts/
apptainer-standin/apptainer): it parses the options clusterkit writes with Apptainer's rules
(image file and bind sources must exist) and runs the command on the host. pyxis needs a SLURM
plugin the dev cluster does not have: its renders are checked (and golden), not run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.spec.launch_plan import IMAGE_CHECK
from conftest import REPO, run_cli
from launch_plans import plan_of, started, task_argv
from slurm_jobs import assert_real_data_parallel

STANDIN = REPO / "tests" / "scripts" / "apptainer-standin"
SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")


def _profile(tmp_path: Path, **container) -> str:
    clusters = tmp_path / "clusters"
    clusters.mkdir(exist_ok=True)
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    profile.update(name="boxed", container={"runtime": "apptainer", "image": str(tmp_path / "train.sif"), **container})
    (clusters / "boxed.yaml").write_text(yaml.safe_dump(profile))
    (tmp_path / "train.sif").write_bytes(b"stand-in image")
    return "boxed"


def _recipe(tmp_path: Path, **fields) -> Path:
    body = {
        "name": "boxed",
        "cluster": _profile(tmp_path),
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "time": "5"},
        "task": {"script": SCRIPT},
        **fields,
    }
    path = tmp_path / "boxed.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_pyxis_takes_srun_options_with_the_run_directory_mounted(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(REPO / "recipes" / "llama-1b-pyxis.yaml")))
    image = "--container-image=/shared/images/clusterkit-pytorch-24.05.sqsh"  # the recipe's image, the profile's mounts
    for step in (plan.image_check, plan.launch):  # the image check, then the launch step
        argv, _ = started(plan, step, "/r d")
        assert argv[5:7] == [image, "--container-mounts=/shared/data:/shared/data:ro,/shared/runs,/r d:/r d"]
    # pyxis runs each task inside the image, the node agent too: with the image's Python.
    assert plan.launch.agent_python == ("python3",) and "apptainer" not in plan.launch.argv


def test_apptainer_is_the_command_the_node_agent_starts(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(REPO / "recipes" / "gpt2-apptainer.yaml")))
    apptainer = [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/project/data",
        "--bind",
        "/r",
        "/project/images/pytorch-2.4.sif",
    ]
    assert task_argv(plan.launch, "/r")[:9] == [*apptainer, "python3"]  # the launcher runs inside it
    assert plan.launch.agent_python == () and not any("container" in word for word in plan.launch.srun)
    # The image check names what the built-in runner needs, and runs inside the image too.
    argv, _ = started(plan, plan.image_check, "/r")
    assert argv[-14:-6] == apptainer and argv[-6:-3] == ["python3", "-c", IMAGE_CHECK]
    assert argv[-3:] == ["clusterkit", "torch", "transformers"]
    cpu = plan_of(render_job(load_recipe(_recipe(tmp_path, container_image=str(tmp_path / "train.sif"))))).launch
    assert task_argv(cpu, "/r")[:5] == ["apptainer", "exec", "--bind", "/r", str(tmp_path / "train.sif")]


def test_an_amd_profile_gets_rocm_not_nv(tmp_path: Path) -> None:
    path = _recipe(tmp_path, resources={"nodes": 2, "gpus_per_node": 2, "time": "5"})
    profile = tmp_path / "clusters" / "boxed.yaml"
    body = yaml.safe_load(profile.read_text())
    body.update(accelerator="gpu", gpu={"model": "MI300X", "memory_gb": 192, "vendor": "amd"})
    profile.write_text(yaml.safe_dump(body))
    argv = plan_of(render_job(load_recipe(path))).launch.argv
    assert argv[:3] == ("apptainer", "exec", "--rocm") and "--nv" not in argv


def test_a_program_that_needs_no_python_package_gets_no_python_check(tmp_path: Path) -> None:
    """A command (a binary, a shell script) in an image without Python: nothing checks for one under
    Apptainer (the node agent runs outside the image); under pyxis only the agent's interpreter."""
    path = _recipe(tmp_path, launcher="command", python="bash", task={"script": "/opt/bin/train", "args": ["--x"]})
    plan = plan_of(render_job(load_recipe(path)))
    assert plan.image_check is None and plan.launch.argv[-2:] == ("/opt/bin/train", "--x")
    _profile(tmp_path, runtime="pyxis")
    plan = plan_of(render_job(load_recipe(path)))
    assert plan.image_check.argv == (
        "python3",
        "-c",
        IMAGE_CHECK,
    )  # the profile's container.python, not the recipe's bash


@pytest.mark.parametrize(
    "fields, mounts, message",
    [
        (
            {"cluster": "dev", "container_image": "x.sif"},
            None,
            "container_image: cluster profile 'dev' runs no container",
        ),
        ({}, ["/elsewhere:{runs}"], "puts /elsewhere over {runs} inside the container, which hides the runs directory"),
        ({}, ["/elsewhere:{parent}:ro"], "which hides the runs directory"),
        ({"runs_dir": "{tmp}/a,b"}, None, "holds ',' or ':'"),
        # Both runtimes split their mount list at ',': one entry holding it is several mounts.
        ({}, ["/data:/data,/elsewhere:{runs}"], "puts /elsewhere over {runs} inside the container"),
        ({}, ["/data:/data:ro,/elsewhere:{parent}:rw"], "puts /elsewhere over {parent} inside the container"),
        ({}, ["/elsewhere:{runs}/"], "puts /elsewhere over {runs}/ inside the container"),
        ({}, ["/elsewhere:{runs}/sub/.."], "which hides the runs directory"),
    ],
)
def test_a_container_that_could_not_see_the_run_is_refused(
    tmp_path: Path, fields: dict, mounts: list | None, message: str
) -> None:
    subst = {"runs": str(tmp_path / "runs"), "parent": str(tmp_path), "tmp": str(tmp_path)}
    path = _recipe(tmp_path, **{k: v.format(**subst) for k, v in fields.items()})
    if mounts:
        _profile(tmp_path, mounts=[m.format(**subst) for m in mounts])
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert message.format(**subst) in str(raised.value)
    _profile(tmp_path, mounts=[f"{tmp_path / 'runs'}", "/data:/data"])  # at its own path, or elsewhere: fine
    load_recipe(_recipe(tmp_path))


def test_the_local_executor_refuses_pyxis(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    _profile(tmp_path, runtime="pyxis")
    done = run_cli("submit", str(path), "--executor", "local", cwd=tmp_path)
    assert done.returncode == 2 and "a pyxis container needs SLURM's srun" in done.stderr


@pytest.mark.slurm
def test_training_in_an_apptainer_container_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    """Through the stand-in: the image is checked once, every node's launcher starts through
    `apptainer exec` with the run directory bound, and the Trainer trains data parallel (world 4)."""
    data = tmp_path / "data"
    data.mkdir()
    tiny = yaml.safe_load((REPO / "recipes" / "tiny-gpt2-cpu.yaml").read_text())
    tiny["task"]["trainer"]["args"].update(max_steps=10, save_steps=10)
    path = _recipe(
        tmp_path,
        task=tiny["task"],
        parallelism=tiny["parallelism"],
        resources={**tiny["resources"], "cpus_per_task": 2},
        env={"PATH": {"prepend": str(STANDIN)}},
    )
    _profile(tmp_path, mounts=[str(data)])
    done = run_cli("submit", str(path), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "boxed").iterdir())
    assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    calls = [json.loads(line) for line in (run_dir / "apptainer-calls.jsonl").read_text().splitlines()]
    assert len(calls) == 3 and calls[0]["command"][1:3] == [
        "-c",
        IMAGE_CHECK,
    ]  # the image check, then one launch per node
    assert sorted(call["node"] for call in calls[1:]) == ["node1", "node2"]
    assert all(
        call["bind"] == [str(data), str(run_dir)] and call["image"] == str(tmp_path / "train.sif") for call in calls
    )


@pytest.mark.slurm
def test_an_image_without_the_launchers_packages_stops_before_any_launcher(dev_cluster: str, tmp_path: Path) -> None:
    """Debian's own python3 stands for an image without torch: the check fails with its message and
    the exit code, and no launcher starts."""
    path = _recipe(
        tmp_path,
        launcher="torchrun",
        python="/usr/bin/python3",
        env={"PATH": {"prepend": str(STANDIN)}},
        resources={"nodes": 1, "time": "5"},
    )
    done = run_cli("submit", str(path), "--follow", cwd=tmp_path)
    assert done.returncode == 1
    run_dir = next((tmp_path / "runs" / "boxed").iterdir())
    log = next(run_dir.glob("*_0_log.err")).read_text()
    assert "clusterkit: the container image has no Python package torch" in log
    assert not (run_dir / "ranks").exists() and len((run_dir / "apptainer-calls.jsonl").read_text().splitlines()) == 1
    assert os.path.getsize(run_dir / "hostfile") > 0

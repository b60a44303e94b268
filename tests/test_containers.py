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
from conftest import REPO, run_cli
from test_slurm_e2e import _assert_real_data_parallel

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


def _launch_lines(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines() if "apptainer exec" in line or "--container-image" in line]


def test_pyxis_takes_srun_options_with_the_run_directory_mounted(tmp_path: Path) -> None:
    loaded = load_recipe(REPO / "recipes" / "llama-1b-pyxis.yaml")
    lines = _launch_lines(render_job(loaded).script)
    mount = (
        "--container-image=/shared/images/clusterkit-pytorch-24.05.sqsh "  # the recipe's image, the profile's mounts
        '--container-mounts=/shared/data:/shared/data:ro,/shared/runs,"$RUN_DIR:$RUN_DIR" \\'
    )
    assert lines == [mount, mount]  # the image check, then the launch step


def test_apptainer_is_the_command_srun_starts(tmp_path: Path) -> None:
    loaded = load_recipe(REPO / "recipes" / "gpt2-apptainer.yaml")
    script = render_job(loaded).script
    exec_line = 'apptainer exec --nv --bind /project/data,"$RUN_DIR" /project/images/pytorch-2.4.sif \\'
    assert _launch_lines(script) == [exec_line, exec_line]
    launch = script.split("clusterkit_node() {")[1]
    assert f"{exec_line}\n  bash -c '" in launch  # the launcher runs inside it
    # The image check names what the built-in runner needs.
    assert "find_spec(m) is None]" in script and '" clusterkit torch transformers ||' in script
    cpu = render_job(load_recipe(_recipe(tmp_path, container_image=str(tmp_path / "train.sif")))).script
    assert "--nv" not in cpu and f'--bind "$RUN_DIR" {tmp_path}/train.sif' in cpu.replace("''", "")


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
    _assert_real_data_parallel(run_dir, world=4, nodes={"node1", "node2"})
    calls = [json.loads(line) for line in (run_dir / "apptainer-calls.jsonl").read_text().splitlines()]
    assert len(calls) == 3 and calls[0]["command"][:2] == ["sh", "-c"]  # the image check, then one launch per node
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

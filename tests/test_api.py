"""The Python API (clusterkit.api, re-exported at the top level), driven as a notebook would: load
with overrides as a dict, render in memory, submit to the local executor, and the Run handle's
status, wait, metrics, logs and cancel; errors are the typed exceptions the CLI maps to exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import clusterkit
from conftest import REPO

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
SLEEP = str(REPO / "tests" / "scripts" / "timed_sleep.py")


def _script_recipe(tmp_path: Path, seconds: float) -> Path:
    path = tmp_path / "sleep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "sleepy",
                "cluster": "dev",
                "runs_dir": str(tmp_path / "runs"),
                "launcher": "python",
                "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
                "task": {"script": SLEEP, "args": [str(seconds)]},
            }
        )
    )
    return path


def test_importing_the_api_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys, clusterkit; clusterkit.load_recipe; clusterkit.Run; "
        "print(sorted(m for m in ('jinja2', 'rich', 'paramiko', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


def test_load_with_a_dict_of_typed_overrides_and_typed_errors(tmp_path: Path) -> None:
    loaded = clusterkit.load_recipe(TINY, {"resources.nodes": 1, "parallelism.micro_batch_size": 2})
    assert (loaded.recipe.resources.nodes, loaded.recipe.parallelism.micro_batch_size) == (1, 2)
    # Values are taken as they are, never parsed: a string stays a string (and is refused here).
    with pytest.raises(clusterkit.RecipeError) as caught:
        clusterkit.load_recipe(TINY, {"resources.nodes": "1; rm -rf ~"})
    assert "resources.nodes" in str(caught.value) and isinstance(caught.value, clusterkit.UserError)
    with pytest.raises(clusterkit.RecipeError, match="expected key.path=value"):
        clusterkit.load_recipe(TINY, {"resources nodes": 1})
    with pytest.raises(clusterkit.UsageError):
        clusterkit.load_recipe(TINY, "resources.nodes=1")  # a lone string is neither a mapping nor a list of texts
    assert clusterkit.load_recipe(TINY, ["resources.nodes=1"]).recipe.resources.nodes == 1  # --set texts work too
    checked = clusterkit.validate(TINY)
    assert checked.warnings == [] and checked.sweep_points is None


def test_render_is_in_memory_and_dry_run_is_what_submit_sends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = clusterkit.render_job(TINY, overrides={"resources.nodes": 1})
    assert "#SBATCH --nodes=1" in job.files["job.sbatch"] and list(tmp_path.iterdir()) == []
    loaded = clusterkit.load_recipe(TINY, {"resources.nodes": 1})
    request = clusterkit.dry_run(loaded, executor="local")
    assert request.files["job.sbatch"] == job.files["job.sbatch"] and list(tmp_path.iterdir()) == []
    with pytest.raises(clusterkit.UsageError, match="already loaded"):
        clusterkit.render_job(loaded, overrides={"resources.nodes": 2})


def test_submit_wait_metrics_logs_and_find_from_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    run = clusterkit.submit(TINY, {"runs_dir": str(runs)}, executor="local")
    assert run.record.cluster == "dev" and Path(run.run_dir).parent == runs / "tiny-gpt2"
    with pytest.raises(clusterkit.WaitTimeout) as caught:
        run.wait(timeout=0.1, poll_s=0.05)
    assert isinstance(caught.value, TimeoutError) and run.job_id in str(caught.value)
    final = run.wait(timeout=600, poll_s=0.5)
    assert (final.state, final.exit_code) == ("COMPLETED", 0)
    rows = run.metrics()
    steps = [row["step"] for row in rows if row.get("event") == "log"]
    assert steps and steps == sorted(steps) and all(row["world_size"] == 4 for row in rows if "world_size" in row)
    assert "==>" in run.logs() and run.logs(rank=3).strip()
    with pytest.raises(clusterkit.UsageError, match="ranks 0-3"):
        run.logs(rank=4)
    monkeypatch.chdir(tmp_path.parent)  # another directory: found by job id under runs_dir
    again = clusterkit.find_run(run.job_id, runs)
    assert again.record == run.record and again.status() == final
    assert [found.job_id for found in clusterkit.list_runs(runs)] == [run.job_id]
    assert again.cancel() is False  # already ended: nothing to cancel
    with pytest.raises(clusterkit.RunNotFound):
        clusterkit.find_run("999999", runs)


def test_cancel_a_running_run(tmp_path: Path) -> None:
    run = clusterkit.submit(_script_recipe(tmp_path, 60), executor="local")
    assert run.cancel() is True
    assert run.wait(timeout=60, poll_s=0.2).state == "CANCELLED"
    assert not list(Path(run.run_dir).glob("timed-*.json")), "the script was stopped before it finished"


def test_the_docs_python_example_runs_as_written(tmp_path: Path) -> None:
    """The notebook-style example of docs/guides/python.md, extracted and run (so it cannot rot)."""
    page = (REPO / "docs" / "guides" / "python.md").read_text()
    start = page.index("<!-- api-example -->")
    code = page[start:].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "recipes").symlink_to(REPO / "recipes")  # run where the page is read, runs kept out of the repo
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["state"] == "COMPLETED" and last["steps"] > 0


@pytest.mark.parametrize(
    "login_host, executor, expected",
    [
        ("login.other-cluster.example", None, "ssh"),  # sbatch is on PATH here, yet the profile names another cluster
        ("login.other-cluster.example", "slurm", "slurm"),  # asked for explicitly
        (None, None, "slurm"),  # no login node: this machine's SLURM
        ("{this host}", None, "slurm"),  # the login node is this machine
    ],
)
def test_submit_goes_to_the_cluster_the_profile_names(
    tmp_path: Path, login_host: str | None, executor: str | None, expected: str
) -> None:
    import shutil
    import socket

    assert shutil.which("sbatch"), "the SLURM client tools are installed here (bin/setup)"
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    if login_host:
        profile["login"] = {"host": socket.gethostname() if login_host == "{this host}" else login_host}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({**profile, "name": "other"}))
    request = clusterkit.dry_run(TINY, cluster=str(tmp_path / "other.yaml"), executor=executor)
    assert request.scheduler == expected and request.cluster == "other"
    if expected == "ssh":
        assert request.login.host == login_host and request.argv[0] == "sbatch"  # sbatch, on the login node
    from conftest import run_cli

    dry = run_cli(
        "submit",
        str(TINY),
        "--cluster",
        str(tmp_path / "other.yaml"),
        "--dry-run",
        *(["--executor", executor] if executor else []),
        cwd=tmp_path,
    )
    assert dry.returncode == 0 and f"# on cluster other with the {expected} executor\n" in dry.stderr, dry.stderr


def test_no_public_name_is_shadowed_by_a_subpackage() -> None:
    """``import clusterkit.load.loader`` sets the attribute ``clusterkit.load`` to the subpackage: a
    public function of that name would turn into a module once anything imported it."""
    subpackages = {path.name for path in (REPO / "clusterkit").iterdir() if (path / "__init__.py").is_file()}
    modules = {path.stem for path in (REPO / "clusterkit").glob("*.py")}
    assert not set(clusterkit.__all__) & (subpackages | modules)

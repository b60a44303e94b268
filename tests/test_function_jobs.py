"""A function's recipe as submitit's executor parameters (spec.function_jobs): every recipe key is
either carried into a named parameter or refused with one line at its place; none is left out."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import msgspec
import pytest

from clusterkit.errors import RecipeError
from clusterkit.launch.functions import load_function_recipe, submit_calls
from clusterkit.spec.function_jobs import LOCAL, REFUSED, SLURM, executor_parameters, setup_lines
from clusterkit.spec.recipe import Recipe, Resources, Srun

# What executor_parameters carries; with REFUSED (and the launcher, refused unless python), every key.
CARRIED = {
    ("name",),
    ("cluster",),
    ("description",),
    ("env",),
    ("setup",),
    ("runs_dir",),
    ("launcher",),
    *(("resources", field) for field in Resources.__struct_fields__ if ("resources", field) not in REFUSED),
    *(("srun", field) for field in Srun.__struct_fields__),
}
HOSTILE = "a b$(touch /tmp/ck-fn-pwned)'\"`x`\\ ~%-;\n second line"


def recipe_file(tmp_path: Path, body: str, name: str = "fn.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"name: fn\nlauncher: python\nruns_dir: {tmp_path / 'runs'}\n{body}", encoding="utf-8")
    return path


def test_every_recipe_key_is_carried_or_refused() -> None:
    keys = {(field,) for field in Recipe.__struct_fields__ if field not in ("resources", "srun")}
    keys |= {("resources", field) for field in Resources.__struct_fields__}
    keys |= {("srun", field) for field in Srun.__struct_fields__}
    assert keys - CARRIED - set(REFUSED) == set(), "a new recipe key: carry it in spec.function_jobs or refuse it"


def test_the_recipe_and_profile_as_slurm_parameters(tmp_path: Path) -> None:
    path = recipe_file(
        tmp_path,
        "resources:\n  nodes: 2\n  gpus_per_node: 2\n  cpus_per_task: 1\n  time: '1:30:00'\n  mem: 1G\n"
        "  account: acct\n  qos: normal\n  constraint: fast\n  reservation: maint\n  exclusive: true\n"
        "  time_min: '30'\n  wait_all_nodes: true\n  extra_sbatch: {comment: hello}\n"
        "setup: ['echo ready']\n"
        f"env: {{GREETING: {msgspec.json.encode(HOSTILE).decode()}, GONE: null, COUNT: 3}}\n"
        "srun: {kill_on_bad_exit: false, wait: 30, cpu_bind: none, label: true, extra: {overlap: true}}\n",
    )
    loaded = load_function_recipe(path)
    chosen = executor_parameters(loaded.recipe, loaded.profile, SLURM)
    assert chosen.executor == SLURM
    assert chosen.parameters == {
        "name": "fn",
        "nodes": 2,
        "tasks_per_node": 2,  # one task per GPU: launcher python's ranks
        "cpus_per_task": 1,
        "timeout_min": 90,
        "slurm_time": "1:30:00",  # the text itself: SLURM's, not rounded to minutes
        "slurm_mem": "1G",
        "slurm_partition": "debug",  # the dev profile's
        "slurm_account": "acct",
        "slurm_qos": "normal",
        "slurm_constraint": "fast",
        "slurm_exclusive": True,
        "slurm_setup": ["echo ready", f"export GREETING={shlex.quote(HOSTILE)}", "unset GONE", "export COUNT=3"],
        "slurm_srun_args": ["--kill-on-bad-exit=0", "--wait=30", "--cpu-bind=none", "--label", "--overlap"],
        "slurm_additional_parameters": {
            "reservation": "maint",
            "time-min": "30",
            "wait-all-nodes": 1,
            "comment": "hello",
        },
    }


def test_setup_lines_give_each_value_as_it_is_and_run_nothing(tmp_path: Path) -> None:
    path = recipe_file(tmp_path, f"env: {{GREETING: {msgspec.json.encode(HOSTILE).decode()}}}\n")
    loaded = load_function_recipe(path)
    script = "\n".join([*setup_lines(loaded.recipe, loaded.profile), 'printf %s "$GREETING"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == HOSTILE
    assert not Path("/tmp/ck-fn-pwned").exists()


def test_local_parameters(tmp_path: Path) -> None:
    loaded = load_function_recipe(
        recipe_file(tmp_path, "resources: {gpus_per_node: 2, time: '2:30'}\nsetup: [echo a]\n")
    )
    chosen = executor_parameters(loaded.recipe, loaded.profile, LOCAL)
    assert chosen.parameters == {
        "name": "fn",
        "nodes": 1,
        "tasks_per_node": 2,
        "cpus_per_task": 1,
        "timeout_min": 3,  # 2:30 rounded up: a limit never shorter than the recipe's
        "local_setup": ["echo a"],
    }


@pytest.mark.parametrize(
    ("body", "key", "line"),
    [
        ("task: {script: train.py}\n", "task", 4),
        ("steps: [{name: a, task: {script: a.py}}]\n", "steps", 4),
        ("launcher: torchrun\n", "launcher", 2),
        ("preemption: {requeue: true}\n", "preemption", 4),
        ("master_port: 29555\n", "master_port", 4),
        ("resources: {spare_nodes: 1}\n", "resources.spare_nodes", 4),
        ("secrets: [TOKEN]\n", "secrets", 4),
        ("hooks: {pre_launch: [echo a]}\n", "hooks", 4),
        ("env: {PATH: {prepend: /opt/bin}}\n", "env", 4),
    ],
)
def test_what_submitit_cannot_carry_stops_with_one_line(tmp_path: Path, body: str, key: str, line: int) -> None:
    text = recipe_file(tmp_path, "").read_text()
    if body.startswith("launcher:"):  # replaces the launcher: python line
        text = text.replace("launcher: python\n", body)
    else:
        text += body
    path = tmp_path / "fn.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as raised:
        submit_calls(load_function_recipe(path), print, [((), {})], LOCAL)
    message = str(raised.value)
    assert message.startswith(f"{path}:{line}: {key}"), message
    assert "\n" not in message
    assert not (tmp_path / "runs").exists(), "nothing is written before the recipe is accepted"


def test_an_ssh_profile_is_refused_in_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "remote.yaml"
    profile.write_text(
        "name: remote\naccelerator: cpu\ngpus_per_node: 1\ngpu_request: none\ncpus_per_node: 2\n"
        "interconnect: ethernet\nlogin: {host: login.example.org}\n"
    )
    path = recipe_file(tmp_path, f"cluster: {profile}\n")
    with pytest.raises(RecipeError, match="submits over SSH: submit_function runs on the login node itself"):
        submit_calls(load_function_recipe(path), print, [((), {})], None)
    assert not (tmp_path / "runs").exists()


def test_several_nodes_on_the_local_executor_are_refused(tmp_path: Path) -> None:
    path = recipe_file(tmp_path, "resources: {nodes: 2}\n")
    with pytest.raises(RecipeError, match="resources.nodes: the local executor runs one node"):
        submit_calls(load_function_recipe(path), print, [((), {})], LOCAL)


@pytest.mark.parametrize("runs_dir", ["runs%j", "my runs", "odd-%x"])
def test_a_run_directory_submitit_cannot_write_unquoted_is_refused(tmp_path: Path, runs_dir: str) -> None:
    path = recipe_file(tmp_path, "")
    path.write_text(path.read_text().replace(f"runs_dir: {tmp_path / 'runs'}", f"runs_dir: {tmp_path / runs_dir}"))
    with pytest.raises(RecipeError, match=r"runs_dir: .*%|runs_dir: .*without %, spaces") as raised:
        submit_calls(load_function_recipe(path), print, [((), {})], LOCAL)
    assert str(raised.value).startswith(f"{path}:3: runs_dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fn.yaml"], "nothing is written"


def test_a_relative_runs_dir_under_a_folder_with_percent_is_refused(tmp_path: Path, monkeypatch) -> None:
    odd = tmp_path / "at 100%j"
    odd.mkdir()
    monkeypatch.chdir(odd)
    path = odd / "fn.yaml"
    path.write_text("name: fn\nlauncher: python\nruns_dir: ./runs\n")
    with pytest.raises(RecipeError, match="without %, spaces or control characters"):
        submit_calls(load_function_recipe(path), print, [((), {})], LOCAL)
    assert sorted(p.name for p in odd.iterdir()) == ["fn.yaml"]


def test_the_guide_names_every_refused_key() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "functions.md").read_text()
    missing = [".".join(path) for path in REFUSED if f"`{'.'.join(path)}`" not in guide]
    assert not missing, f"docs/guides/functions.md does not say these are refused: {missing}"


def test_without_a_launcher_the_cpus_per_task_are_a_task_per_gpus(tmp_path: Path) -> None:
    """The dev profile's 2 CPUs per node shared by its 2 tasks (torchrun's one task per node would
    ask 2 CPUs per task: 4 per node, a job SLURM never starts)."""
    path = tmp_path / "fn.yaml"
    path.write_text(f"name: fn\nruns_dir: {tmp_path / 'runs'}\nresources: {{gpus_per_node: 2}}\n")
    parameters = executor_parameters(*_loaded_pair(path), SLURM).parameters
    assert (parameters["tasks_per_node"], parameters["cpus_per_task"]) == (2, 1)


def test_an_override_to_another_launcher_is_refused(tmp_path: Path) -> None:
    path = recipe_file(tmp_path, "")
    with pytest.raises(
        RecipeError, match="^--set launcher=torchrun: launcher: a function's tasks are launcher: python"
    ):
        submit_calls(load_function_recipe(path, ["launcher=torchrun"]), print, [((), {})], LOCAL)


def _loaded_pair(path: Path):
    loaded = load_function_recipe(path)
    return loaded.recipe, loaded.profile


@pytest.mark.parametrize(
    ("request_kind", "expected"), [("gres", {"slurm_gres": "gpu:4"}), ("gpus-per-node", {"gpus_per_node": 4})]
)
def test_the_profiles_way_of_asking_for_gpus(tmp_path: Path, request_kind: str, expected: dict) -> None:
    profile = tmp_path / "gpus.yaml"
    profile.write_text(
        f"name: gpus\ngpus_per_node: 4\ngpu_request: {request_kind}\ncpus_per_node: 32\ninterconnect: ethernet\n"
        "gpu: {model: A100, memory_gb: 80}\npartition: gpu\naccount: lab\nmodules: [cuda/12.4]\n"
    )
    loaded = load_function_recipe(recipe_file(tmp_path, f"cluster: {profile}\n"))
    parameters = executor_parameters(loaded.recipe, loaded.profile, SLURM).parameters
    assert {key: parameters.get(key) for key in expected} == expected
    assert (parameters["tasks_per_node"], parameters["cpus_per_task"]) == (4, 8)
    assert (parameters["slurm_partition"], parameters["slurm_account"]) == ("gpu", "lab")
    assert parameters["slurm_setup"][0] == "module load cuda/12.4"


def test_the_local_executor_shows_a_gpu_profiles_gpus(tmp_path: Path) -> None:
    """Without gpus_per_node, submitit's LocalExecutor sets CUDA_VISIBLE_DEVICES empty: no GPU at all."""
    profile = tmp_path / "gpus.yaml"
    profile.write_text(
        "name: gpus\ngpus_per_node: 2\ncpus_per_node: 8\ninterconnect: ethernet\ngpu: {model: A100, memory_gb: 80}\n"
    )
    loaded = load_function_recipe(recipe_file(tmp_path, f"cluster: {profile}\n"))
    assert executor_parameters(loaded.recipe, loaded.profile, LOCAL).parameters["gpus_per_node"] == 2

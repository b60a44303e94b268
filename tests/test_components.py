"""Heterogeneous jobs (issue 32, ``components:``): components beside training, each a SLURM hetjob
component with its own nodes, partition, GPUs, ranks per node, srun options and env; started as
``srun --het-group=N`` steps before training, every process told where each runs
(CLUSTERKIT_COMPONENT_<NAME>_HOSTS/ADDR/PORT), training waiting for each port, the components stopped
when training ends. The dev-cluster tests (marked slurm) are the real proof."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hostile_fields
from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.supervisor import components
from clusterkit.supervisor.environment import JobEnvironment
from conftest import REPO, run_cli
from launch_plans import plan_of, started

SCRIPTS = REPO / "tests" / "scripts"


def _recipe(tmp_path: Path, *component_list: dict, **fields) -> Path:
    body = {
        "name": "het",
        "cluster": "dev",
        "runs_dir": str(tmp_path / "runs"),
        "launcher": "python",
        "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": str(SCRIPTS / "het_train.py")},
        "components": list(component_list)
        or [
            {
                "name": "reward",
                "command": [sys.executable, str(SCRIPTS / "het_component.py")],
                "ranks_per_node": 2,
                "port": 8310,
                "ready_timeout_s": 60,
                "env": {"REWARD_SETTING": "a b; $(touch x)"},
                "srun": {"label": True},
            }
        ],
        **fields,
    }
    path = tmp_path / "het.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_the_header_holds_one_hetjob_group_per_component(tmp_path: Path) -> None:
    extra = {"name": "gen", "command": ["serve"], "nodes": 2, "cpus_per_task": 3, "partition": "other"}
    job = render_job(load_recipe(_recipe(tmp_path, {"name": "reward", "command": ["serve"]}, extra)))
    header = [line for line in job.script.splitlines() if line.startswith("#SBATCH")]
    groups = "\n".join(header).split("#SBATCH hetjob\n")
    assert len(groups) == 3
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2" in groups[0]  # training's: het group 0
    assert groups[1].splitlines() == ["#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=debug"]
    assert groups[2].splitlines() == [
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=other",
    ]
    assert "\n\n" not in job.script  # as SLURM keeps a heterogeneous job's script: no empty line
    script = tmp_path / "job.sbatch"
    script.write_text(job.script)
    subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run(["shellcheck", "-S", "warning", str(script)], check=True)


def test_each_component_is_an_srun_step_of_its_own_het_group(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path))))
    (reward,) = plan.components
    assert (reward.name, reward.port, reward.step.het_group, reward.step.replace) == ("reward", 8310, 1, True)
    argv, env = started(plan, reward.step, "/r")  # given its group's hosts: node1 here
    assert argv[:6] == ["srun", "--het-group=1", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node1"]
    assert "--label" in argv and "--output=/r/component_reward_%t.out" in argv
    assert env["REWARD_SETTING"] == "a b; $(touch x)"  # a value, never shell
    launch, _ = started(plan, plan.launch, "/r")
    assert not any(word.startswith("--het-group") for word in launch)  # training: srun's default, group 0


class _Groups(JobEnvironment):
    """SLURM's variables for each het group's nodes, read without scontrol (a comma-separated list)."""

    def group_hosts(self, group: int) -> list[str]:
        return [host for host in self.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}", "").split(",") if host]


def test_every_process_is_told_where_each_component_runs(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path))))
    placed = components.place(plan, _Groups({"SLURM_JOB_NODELIST_HET_GROUP_1": "node2"}))
    assert components.told(plan, ["node1"], placed) == {
        "CLUSTERKIT_COMPONENTS": "train,reward",
        "CLUSTERKIT_COMPONENT_TRAIN_HOSTS": "node1",
        "CLUSTERKIT_COMPONENT_TRAIN_ADDR": "node1",
        "CLUSTERKIT_COMPONENT_REWARD_HOSTS": "node2",
        "CLUSTERKIT_COMPONENT_REWARD_ADDR": "node2",
        "CLUSTERKIT_COMPONENT_REWARD_PORT": "8310",
    }
    # A job SLURM did not give the group's nodes (not submitted as a heterogeneous job): not training.
    assert components.place(plan, _Groups({})) is None


@pytest.mark.parametrize(
    "fields, component, message",
    [
        ({}, {"name": "train"}, "components[0].name: 'train' is clusterkit's own name"),
        ({}, {"name": "launch"}, "components[0].name: 'launch' is clusterkit's own name"),
        ({}, {"name": "Reward"}, "components[0].name: must be lower-case letters"),
        ({}, {"name": "a\nb"}, "components[0].name: must be lower-case letters"),
        ({}, {"command": []}, "components[0].command: "),
        ({}, {"command": ["a\nb"]}, "components[0].command[0]: must be a non-empty single line"),
        ({}, {"sbatch": {"time": "5"}}, "components[0].sbatch.time: --time is not the component's to set"),
        ({}, {"sbatch": {"nodes": 2}}, "components[0].sbatch.nodes: --nodes is not the component's to set; set nodes"),
        ({}, {"sbatch": {"mem": "1G\n#SBATCH --x"}}, "components[0].sbatch: must be a single line"),
        ({}, {"srun": {"het-group": 2}}, "components[0].srun.het-group: --het-group is given by clusterkit"),
        ({}, {"srun": {"nodelist": "x"}}, "components[0].srun.nodelist: --nodelist is given by clusterkit"),
        ({}, {"env": {"RANK": "1"}}, "components[0].env.RANK: RANK is set by"),
        ({}, {"env": {"CLUSTERKIT_COMPONENT_X_ADDR": "1"}}, "is set by clusterkit"),
        ({}, {"env": {"BASH_ENV": "/x"}}, "components[0].env.BASH_ENV: BASH_ENV names a file"),
        ({}, {"gpus_per_node": 1}, "components[0].gpus_per_node: cluster profile 'dev' has no GPUs"),
        ({}, {"ready_timeout_s": 5}, "components[0].ready_timeout_s: waits for the component's port: give port too"),
        ({"service": {"command": ["x"], "port": 1}}, {}, "service: cannot be combined with components"),
        ({"resources": {"nodes": 1, "array": "0-3"}}, {}, "resources.array: cannot be combined with components"),
        ({"resources": {"nodes": 1, "spare_nodes": 1}}, {}, "resources.spare_nodes: cannot be combined"),
        ({"launcher": "deepspeed", "process_model": "batch_launcher"}, {}, "launcher: cannot be combined"),
        # sbatch drops a heterogeneous job's empty lines: this value would lose its own.
        ({"env": {"NOTE": "a\n\nb"}}, {}, "env.NOTE: holds an empty line, which SLURM drops"),
        ({"env": {"NOTE": {"prepend": "a\n\nb"}}}, {}, "env.NOTE: holds an empty line"),
    ],
)
def test_bad_components_stop_with_one_line(tmp_path: Path, fields: dict, component: dict, message: str) -> None:
    path = _recipe(tmp_path, {"name": "reward", "command": ["serve"], **component}, **fields)
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert message in str(raised.value), str(raised.value)
    done = run_cli("validate", str(path), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_the_local_executor_refuses_a_heterogeneous_job(tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path)), "--executor", "local", "--dry-run", cwd=tmp_path)
    assert done.returncode == 2 and "components: a heterogeneous job needs SLURM" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_dry_run_lists_each_component_step(tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "# reward: 1 x 2 task(s) per node in het group 1: " in done.stderr  # the listing, beside the script
    assert "#SBATCH hetjob\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n" in done.stdout


def test_two_components_of_one_name_are_refused(tmp_path: Path) -> None:
    path = _recipe(tmp_path, {"name": "gen", "command": ["a"]}, {"name": "gen", "command": ["b"]})
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert "components[1].name: 'gen' is the name of an earlier component" in str(raised.value)


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["python", "torchrun"])  # training: a task per rank, or torchrun per node
def test_a_heterogeneous_job_on_the_dev_cluster(dev_cluster: str, tmp_path: Path, launcher: str) -> None:
    """Component reward (1 node, 2 ranks) serves HTTP; training (1 node, 2 ranks of gloo) reads its
    address from the documented variables and calls it each step; SLURM holds two components; when
    training ends the component is stopped; the dry run is what sbatch got."""
    recipe = str(_recipe(tmp_path, launcher=launcher))
    dry = run_cli("submit", recipe, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    done = run_cli("submit", recipe, "--follow", cwd=tmp_path)
    assert done.returncode == 0 and "COMPLETED" in done.stdout, done.stdout + done.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run dir: ")))
    job_id = run_dir.name
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True).stdout
    offsets = sorted(part for part in shown.split() if part.startswith("HetJobOffset="))
    assert offsets == ["HetJobOffset=0", "HetJobOffset=1"], shown
    submitted = subprocess.run(
        ["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True, check=True
    ).stdout
    assert submitted == dry.stdout
    # The component: two ranks of its own world on a node of its own, told everyone's place.
    served = [json.loads((run_dir / f"component-{rank}.json").read_text()) for rank in (0, 1)]
    trained = [json.loads((run_dir / f"train-{rank}.json").read_text()) for rank in (0, 1)]
    (reward_node,) = {s["node"] for s in served}
    (train_node,) = {t["node"] for t in trained}
    assert reward_node != train_node
    assert [(s["rank"], s["world"], s["master"]) for s in served] == [(0, 2, reward_node), (1, 2, reward_node)]
    assert served[0]["extra"] == "a b; $(touch x)"
    told = {
        "CLUSTERKIT_COMPONENTS": "train,reward",
        "CLUSTERKIT_COMPONENT_TRAIN_HOSTS": train_node,
        "CLUSTERKIT_COMPONENT_TRAIN_ADDR": train_node,
        "CLUSTERKIT_COMPONENT_REWARD_HOSTS": reward_node,
        "CLUSTERKIT_COMPONENT_REWARD_ADDR": reward_node,
        "CLUSTERKIT_COMPONENT_REWARD_PORT": "8310",
    }
    assert all(s["told"] == {**told, "CLUSTERKIT_COMPONENT": "reward"} for s in served)
    # Training: each of its 5 steps answered by the component's ranks (port and port + 1) in turn.
    assert all(t["world"] == 2 and t["told"] == {**told, "CLUSTERKIT_COMPONENT": "train"} for t in trained)
    assert all([a["rank"] for a in t["answers"]] == [0, 1, 0, 1, 0] for t in trained)
    # Training's end stopped the component (it serves forever otherwise): both ranks got SIGTERM.
    assert all((run_dir / f"component-stopped-{rank}").exists() for rank in (0, 1))
    log = (run_dir / f"{job_id}_0_log.out").read_text()
    assert "component reward answers at" in log and "component reward stopped (0)" in log  # it ended by itself


@pytest.mark.slurm
def test_a_component_that_never_answers_stops_the_job(dev_cluster: str, tmp_path: Path) -> None:
    silent = {"name": "reward", "command": ["sleep", "600"], "port": 8311, "ready_timeout_s": 5}
    done = run_cli("submit", str(_recipe(tmp_path, silent)), "--follow", cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout, done.stdout + done.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run dir: ")))
    log = (run_dir / f"{run_dir.name}_0_log.out").read_text()
    assert "component reward at" in log and "did not answer (not within 5 s): not training" in log
    assert "component reward stopped" in log and not list(run_dir.glob("train-*.json"))


# Every string a component takes (hostile_fields walks the Component struct as it walks the recipe).
COMPONENT_FIELDS = [path for path in hostile_fields.RECIPE_FIELDS if path[:1] == ("components",)]
HOSTILE = ["$(touch CANARY/d)`touch CANARY/b`;'\"", "a\nb", "a\n\nb", "p\n", "\x00", "\u2028", "-x %j ~ {rank}", "é#!"]


def test_every_component_string_is_walked() -> None:
    assert {p[2] for p in COMPONENT_FIELDS} >= {"name", "command", "partition", "sbatch", "srun", "env"}


@pytest.mark.parametrize("path", COMPONENT_FIELDS, ids=lambda path: ".".join(map(str, path)))
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_hostile_component_values_are_refused_or_carried_exactly(tmp_path: Path, path: tuple, value: str) -> None:
    """One line and exit 2, or a script bash and shellcheck accept that holds the value nowhere as
    shell, and a plan that carries it exactly to the component's srun step."""
    canary = tmp_path / "canary"
    canary.mkdir()
    value = value.replace("CANARY", str(canary))
    body = yaml.safe_load(_recipe(tmp_path).read_text())
    body["components"][0].update(partition="p", sbatch={"comment": "c"}, srun={"label": True}, env={"E": "e"})
    hostile_fields._put(body, path, value)
    (tmp_path / "het.yaml").write_text(yaml.safe_dump(body, allow_unicode=False))
    out = tmp_path / "out"
    done = run_cli("render", str(tmp_path / "het.yaml"), "-o", str(out), cwd=tmp_path)
    if done.returncode != 0:
        assert done.returncode == 2 and not out.exists(), done.stderr
        assert len(done.stderr.splitlines()) == 1 and hostile_fields.ONE_LINE_ERROR.match(done.stderr.strip())
        return
    script = out / "job.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run(["shellcheck", "-s", "bash", "-S", "warning", str(script)], check=True)
    assert sorted(canary.iterdir()) == []
    step = json.loads((out / "plan.json").read_text())["components"][0]["step"]
    carried = {"command": step["argv"], "env": step["env"], "srun": step["srun"]}.get(path[2])
    if path[2] in ("command", "env") and path[-1] != hostile_fields.KEY:
        assert value in (carried if path[2] == "command" else carried.values())


@pytest.mark.parametrize(
    "request_kind, line", [("gres", "--gres=gpu:3"), ("gpus-per-node", "--gpus-per-node=3"), ("none", None)]
)
def test_a_component_asks_for_gpus_as_the_profile_says(tmp_path: Path, request_kind: str, line: str | None) -> None:
    profile = tmp_path / "gpu.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": "gpu",
                "accelerator": "gpu",
                "gpus_per_node": 4,
                "gpu_request": request_kind,
                "cpus_per_node": 8,
                "interconnect": "loopback",
            }
        )
    )
    path = _recipe(tmp_path, {"name": "reward", "command": ["serve"], "gpus_per_node": 3}, cluster=str(profile))
    script = render_job(load_recipe(path)).script
    component = script.split("#SBATCH hetjob\n", 1)[1].split("set -euo", 1)[0]
    assert (f"#SBATCH {line}\n" in component) if line else ("gpu" not in component)


class _Step:
    """A started component's step as stop_all sees it: ends on SIGTERM to its tasks, or only when stopped."""

    def __init__(self, ends_on_term: bool) -> None:
        self.ends_on_term, self.termed, self.stopped = ends_on_term, False, False

    def poll(self, timeout_s: float) -> int | None:
        return 0 if self.termed and self.ends_on_term else None

    def stop(self) -> int:
        self.stopped = True
        return 137


class _Signals(JobEnvironment):
    def __init__(self, steps: dict[int, _Step], reachable: bool) -> None:
        super().__init__({})
        self.steps, self.reachable, self.sent = steps, reachable, []

    def signal_group(self, group: int, signum: int) -> bool:
        self.sent.append((group, signum))
        self.steps[group].termed = self.reachable
        return self.reachable


@pytest.mark.parametrize("reachable, ends_on_term", [(True, True), (True, False), (False, True)])
def test_components_are_stopped_last_first_with_sigterm_then_their_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reachable: bool, ends_on_term: bool
) -> None:
    extra = {"name": "gen", "command": ["serve"]}
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, {"name": "reward", "command": ["serve"]}, extra))))
    steps = {1: _Step(ends_on_term), 2: _Step(ends_on_term)}
    job = _Signals(steps, reachable)
    monkeypatch.setattr(components, "STOP_GRACE_S", 0)
    components.stop_all(job, plan.components, [steps[1], steps[2]])
    assert job.sent == [(2, signal.SIGTERM), (1, signal.SIGTERM)]  # the last started first
    # A component that ended on SIGTERM is left to end; one that did not (or could not be told) is ended.
    assert all(step.stopped is not (reachable and ends_on_term) for step in steps.values())


def test_status_names_each_component_from_the_plan(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from clusterkit.cli.runs import _components

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = SimpleNamespace(scheduler="slurm", path=run_dir)
    assert _components(record) == []  # no plan yet
    (run_dir / "plan.json").write_text(render_job(load_recipe(_recipe(tmp_path))).files["plan.json"])
    assert _components(record) == [
        "component reward: 1 nodes x 2 ranks, het group 1, port 8310, logs component_reward_<rank>.out"
    ]
    (run_dir / "plan.json").unlink()
    os.mkfifo(run_dir / "plan.json")  # the job's to write: never waited on
    assert _components(record) == []


def test_a_job_without_het_groups_has_no_component_nodes() -> None:
    """Not SLURM_JOB_NODELIST's (group 0's) where the group's variable is missing: the plan's
    components then stop the job before training (components.place), nothing runs on training's nodes."""
    from clusterkit.supervisor.environment import SlurmEnvironment

    assert SlurmEnvironment({"SLURM_JOB_NODELIST": "node1"}).group_hosts(1) == []

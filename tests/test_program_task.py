"""task.program (issue 31, item 2): an executable each rank runs as it is (a compiled binary such as
llm.c's train_gpt2cu, a shell script, a JAX process without torchrun), started by srun, one task per
rank, with the rank variables set and nothing of clusterkit's left between srun's task and the
program (the node agent execs it); or once per node by launcher: command. Validation, the launch
plan, the node agent's exec, and end to end on the local executor (and, marked slurm, the dev cluster)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.supervisor.plan import LaunchPlan, Recovery, Step
from conftest import REPO, run_cli
from launch_plans import plan_of

PROGRAMS = REPO / "tests" / "programs"
RANK_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
HOSTILE_ARG = "$(touch CANARY) 'a b' \"c\" ; `x` %j ~ -n {x}"


def _recipe(tmp_path: Path, task: dict, **fields) -> Path:
    body = {
        "name": "prog",
        "cluster": "dev",
        "launcher": "srun",
        "resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"},
        "task": task,
        "runs_dir": str(tmp_path / "runs"),
        **fields,
    }
    path = tmp_path / "prog.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _refused(tmp_path: Path, task: dict, **fields) -> str:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, task, **fields))
    return str(raised.value)


# --- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate", "python", "mpirun"])
def test_a_program_with_a_launcher_that_runs_python_is_refused(tmp_path: Path, launcher: str) -> None:
    message = _refused(tmp_path, {"program": "./train_gpt2cu"}, launcher=launcher)
    assert f"task.program: launcher {launcher} runs Python; task.program runs with launcher: command or srun" in (
        message
    )


@pytest.mark.parametrize(
    "task, what",
    [
        (
            {"script": "train.py"},
            "task.script; use launcher: torchrun or deepspeed or accelerate or python or command or mpirun",
        ),
        (
            {"trainer": {"model": {"pretrained": "gpt2"}}},
            "the built-in Trainer runner; use launcher: torchrun or deepspeed or accelerate or python or mpirun",
        ),
    ],
)
def test_launcher_srun_starts_only_a_program(tmp_path: Path, task: dict, what: str) -> None:
    assert f"launcher: launcher srun does not start {what}" in _refused(tmp_path, task)


@pytest.mark.parametrize(
    "task, fields, message",
    [
        ({"program": "./a", "module": True}, {}, "task.module: task.program is an executable, run as it is"),
        ({"program": "./a", "script": "b.py"}, {}, "task: give exactly one of task.trainer"),
        ({"program": "python3 -u"}, {}, "task.program: 'python3 -u' is one executable's name; give its arguments"),
        ({"program": "~/llm.c/train_gpt2cu"}, {}, "task.program: ~/llm.c/train_gpt2cu: no shell runs it, so '~'"),
        ({"program": "./a"}, {"launcher_args": ["-x"]}, "launcher srun takes no launcher_args; use task.args"),
        ({"program": "./a"}, {"snapshot": True}, "snapshot: task.program is run as it is"),
        ({"program": "./a"}, {"process_model": "launcher_per_node"}, "is not how launcher srun starts ranks"),
        ({"program": "./a"}, {"launcher": "command", "process_model": "task_per_gpu"}, "not how launcher command"),
    ],
)
def test_what_a_program_cannot_be_is_refused(tmp_path: Path, task: dict, fields: dict, message: str) -> None:
    assert message in _refused(tmp_path, task, **fields)


def test_a_bare_name_that_is_also_a_file_here_is_refused_as_ambiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare name is looked up on the nodes' PATH (as a shell would), so a file of that name in the
    submit directory would silently not be the one run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train_gpt2cu").write_bytes(b"\x7fELF")
    message = _refused(tmp_path, {"program": "train_gpt2cu"})
    assert "task.program: train_gpt2cu is looked up on the nodes' PATH, not taken from here; " in message
    assert "for the file in this folder write ./train_gpt2cu" in message
    assert load_recipe(_recipe(tmp_path, {"program": "./train_gpt2cu"})).recipe.task.program == "./train_gpt2cu"


def test_a_refusal_is_one_line_with_file_line_and_exit_2(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, {"program": "./a"}, launcher="torchrun")
    done = run_cli("validate", str(recipe))
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    line = recipe.read_text().splitlines().index("  program: ./a") + 1
    assert lines[0].startswith(f"{recipe}:{line}: task.program: launcher torchrun runs Python"), lines


# --- the launch plan --------------------------------------------------------------------------------


def test_the_launch_step_execs_the_program_per_rank_with_its_words_as_written(tmp_path: Path) -> None:
    args = ["-pn", "4", "-pr", "{rank}", "-ps", "{master_addr}", HOSTILE_ARG]
    loaded = load_recipe(_recipe(tmp_path, {"program": "./train_gpt2cu", "args": args}))
    assert (loaded.recipe.process_model, loaded.recipe.tasks_per_node) == ("task_per_gpu", 2)
    launch = plan_of(render_job(loaded)).launch
    assert launch.argv == ("./train_gpt2cu", *args)  # no interpreter, no wrapper: the program is argv[0]
    assert launch.expand == (4, 6)  # only the run-time values are filled in; {x} and the rest stay
    assert (launch.replace, launch.ranks, launch.ntasks, launch.tasks_per_node) == (True, "task", 4, 2)
    assert launch.env == {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"} and launch.signal_to_launcher


def test_the_preflight_of_a_program_job_runs_clusterkits_python_ranks(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, {"program": "./a"}, preflight=True))))
    assert plan.preflight is not None and plan.launch.replace
    assert (plan.preflight.argv[0], plan.preflight.replace, plan.preflight.ranks) == ("python3", False, "task")
    assert "clusterkit.runtime.preflight" in plan.preflight.argv


def test_launcher_command_runs_a_program_once_per_node_under_the_node_agent(tmp_path: Path) -> None:
    launch = plan_of(render_job(load_recipe(_recipe(tmp_path, {"program": "./a", "args": ["b"]}, launcher="command"))))
    assert (launch.launch.argv, launch.launch.replace, launch.launch.ranks, launch.launch.tasks_per_node) == (
        ("./a", "b"),
        False,
        "node",
        1,
    )


def test_a_plan_without_the_replace_field_still_loads(tmp_path: Path) -> None:
    """plan.json written before the field: the supervisor reads it with the agent staying the parent."""
    from clusterkit.supervisor.plan import load_plan

    data = json.loads(plan_of(render_job(load_recipe(_recipe(tmp_path, {"program": "./a"})))).to_json())
    del data["launch"]["replace"]
    assert load_plan(json.dumps(data)).launch.replace is False


# --- the node agent's exec --------------------------------------------------------------------------


def _agent(tmp_path: Path, argv: tuple[str, ...], expand: tuple[int, ...] = ()) -> tuple[subprocess.Popen, Path]:
    """The node agent of one task (rank 3 of 4) with a plan whose launch step execs ``argv``."""
    step = Step(
        name="launch",
        hosts="train",
        nodes=2,
        tasks_per_node=2,
        argv=argv,
        expand=expand,
        env={"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
        ranks="task",
        replace=True,
    )
    plan = LaunchPlan(
        job_name="p", job_kind="job", train_nodes=2, slots_per_node=2, launch=step, recovery=Recovery("USR2", 0, 0)
    )
    (tmp_path / "plan.json").write_text(plan.to_json())
    env = {
        "PATH": os.environ["PATH"],
        **step.env,  # as srun exports it to every task
        "RUN_DIR": str(tmp_path),
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "12345",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS": "4",
        "SLURMD_NODENAME": "n2",
        "PYTHONPATH": str(REPO),
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "clusterkit.supervisor", "node", str(tmp_path / "plan.json"), "launch"],
        cwd=tmp_path,  # the job's working directory: a relative program is found from here
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    return agent, tmp_path


def _record(path: Path) -> dict[str, list[str]]:
    record: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        record.setdefault(name, []).append(value)
    return record


def _rank_env_binary(tmp_path: Path) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here (cc)")
    binary = tmp_path / "bin dir" / "rank_env"
    binary.parent.mkdir()
    subprocess.run(["cc", "-O1", "-o", str(binary), str(PROGRAMS / "rank_env.c")], check=True)
    return binary


def test_the_node_agent_becomes_the_program_with_the_rank_variables_set(tmp_path: Path) -> None:
    """exec, not a child: the program has the agent's pid (srun's task), its own binary as
    /proc/self/exe, its arguments byte for byte, and not Python's ignored SIGPIPE/SIGXFSZ."""
    binary = _rank_env_binary(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    agent, _ = _agent(tmp_path, (str(binary), "{run_dir}/out", "{rank}", HOSTILE_ARG), expand=(1, 2))
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    record = _record(out / "rank-3.txt")
    assert {name: record[name] for name in RANK_NAMES} == {
        "RANK": ["3"],
        "LOCAL_RANK": ["1"],
        "WORLD_SIZE": ["4"],
        "LOCAL_WORLD_SIZE": ["2"],
        "NODE_RANK": ["1"],
        "MASTER_ADDR": ["10.0.0.1"],
        "MASTER_PORT": ["12345"],
    }
    assert record["pid"] == [str(agent.pid)] and record["exe"] == [str(binary)]
    assert record["arg"] == ["3", HOSTILE_ARG]
    ignored = int(record["sigign"][0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), hex(ignored)
    assert not (tmp_path / "ranks").exists()  # nothing of clusterkit's was left to record the end


@pytest.mark.parametrize(
    "program, code, why",
    [("./not-here", 127, "No such file or directory"), ("./plan.json", 126, "Permission denied")],
)
def test_a_program_that_cannot_start_fails_its_task_saying_so(
    tmp_path: Path, program: str, code: int, why: str
) -> None:
    """Nothing was exec'd, so the agent is still there to say why and record the node's end."""
    agent, _ = _agent(tmp_path, (program,))
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == code and "clusterkit: cannot start" in err and why in err, err
    assert (tmp_path / "ranks" / "node1.exit").read_text().split()[1] == str(code)


# --- end to end -----------------------------------------------------------------------------------


def _program_recipe(tmp_path: Path, program: str) -> Path:
    return _recipe(tmp_path, {"program": program, "args": ["{run_dir}/out", "{rank}", HOSTILE_ARG]}, setup=[])


def _assert_every_rank(run_dir: Path, program: Path, nodes: list[str], under_srun: Callable[[list[str]], bool]) -> None:
    """Each of the 2 x 2 ranks got exactly its environment, and srun's task was the program itself."""
    records = {int(path.stem.split("-")[1]): _record(path) for path in (run_dir / "out").glob("rank-*.txt")}
    assert sorted(records) == [0, 1, 2, 3]
    ports = {record["MASTER_PORT"][0] for record in records.values()}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, record in records.items():
        node, local = divmod(rank, 2)
        expected = {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "NODE_RANK": str(node),
            "MASTER_ADDR": nodes[0],
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": "4",
            "RUN_DIR": str(run_dir),
        }
        assert {name: record[name][0] for name in expected} == expected, rank
        assert record["arg"] == [str(rank), HOSTILE_ARG]
        # The program is srun's task itself: its parent is srun's (the local stand-in, a Python
        # script; slurmstepd on SLURM), not the node agent.
        assert "python" not in record["exe"][0], record["exe"]
        assert under_srun(record["parent"][0].split(" ")), record["parent"]
    if program.suffix != ".sh":
        assert {record["exe"][0] for record in records.values()} == {str(program)}


@pytest.mark.parametrize("kind", ["shell", "c"])
def test_a_program_runs_per_rank_with_its_environment_on_the_local_executor(tmp_path: Path, kind: str) -> None:
    program = PROGRAMS / "rank_env.sh" if kind == "shell" else _rank_env_binary(tmp_path)
    done = run_cli(
        "submit", str(_program_recipe(tmp_path, str(program))), "--executor", "local", "--follow", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "prog").iterdir())
    _assert_every_rank(
        run_dir, program, ["127.0.0.1", "127.0.0.2"], lambda words: words[1].endswith("/.local-bin/srun")
    )
    # A task per rank: srun's per-task log is the rank's own, as with launcher: python.
    logs = run_cli("logs", run_dir.name, "--rank", "2", "--runs-dir", str(tmp_path / "runs"))
    assert logs.returncode == 0 and logs.stdout == f"==> {run_dir.name}_2_log.out <==\nrank_env: rank 2 of 4\n", logs


def test_a_relative_program_is_run_from_the_submit_directory(tmp_path: Path) -> None:
    shutil.copy(PROGRAMS / "rank_env.sh", tmp_path / "rank_env.sh")
    done = run_cli(
        "submit", str(_program_recipe(tmp_path, "./rank_env.sh")), "--executor", "local", "--follow", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(next((tmp_path / "runs" / "prog").iterdir()).glob("out/rank-*.txt"))) == 4


def test_a_failing_program_fails_the_job_with_its_code(tmp_path: Path) -> None:
    done = run_cli(
        "submit", str(_recipe(tmp_path, {"program": "false"})), "--executor", "local", "--follow", cwd=tmp_path
    )
    assert done.returncode != 0 and "FAILED" in done.stdout, done.stdout + done.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("kind", ["shell", "c"])
def test_a_program_runs_per_rank_with_its_environment_on_the_dev_cluster(
    dev_cluster: str, tmp_path: Path, kind: str
) -> None:
    program = PROGRAMS / "rank_env.sh" if kind == "shell" else _rank_env_binary(tmp_path)
    done = run_cli("submit", str(_program_recipe(tmp_path, str(program))), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "prog").iterdir())
    # Under SLURM the task's parent is slurmstepd (its title "slurmstepd: [<job>.<step>]").
    _assert_every_rank(run_dir, program, ["node1", "node2"], lambda words: words[0].startswith("slurmstepd"))


# --- clusterkit import ------------------------------------------------------------------------------


def test_an_srun_line_starting_a_binary_per_task_imports_as_a_program_per_rank(tmp_path: Path) -> None:
    """llm.c's shape, hand-written: srun runs the binary on each of a node's tasks."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --time=10\n"
        "srun ./train_gpt2cu -pn 4 -pi tcp\n"
    )
    done = run_cli("import", str(script), "--cluster", "dev", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load(done.stdout)
    assert (recipe["launcher"], recipe["resources"]["gpus_per_node"]) == ("srun", 2)
    assert recipe["task"] == {"program": "./train_gpt2cu", "args": ["-pn", "4", "-pi", "tcp"]}

"""A front end that is itself the launcher (issue 31, item 5): ``launcher: command`` with
``process_model: batch_launcher`` runs your program (task.program or task.script, as written) once in
the batch shell, where it starts every rank itself through an srun of its own (or DeepSpeed's SLURM
launcher, as GPT-NeoX's deepy.py does), given the rank contract of the batch shell: MASTER_ADDR,
MASTER_PORT, RUN_DIR, NNODES, GPUS_PER_NODE, WORLD_SIZE and CLUSTERKIT_HOSTFILE."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from conftest import REPO, run_cli
from launch_plans import plan_of

FRONT_END = str(REPO / "tests" / "programs" / "front_end.sh")
ODD_ARG = "$(touch x) 'a b' ; {x} %j"


def _recipe(tmp_path: Path, **fields) -> Path:
    body = {
        "name": "fe",
        "cluster": "dev",
        "launcher": "command",
        "process_model": "batch_launcher",
        "resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"},
        "task": {"program": FRONT_END, "args": ["{master_port}", ODD_ARG]},
        "runs_dir": str(tmp_path / "runs"),
        **fields,
    }
    path = tmp_path / "fe.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_the_front_end_runs_once_in_the_batch_shell_as_written(tmp_path: Path) -> None:
    launch = plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch
    # Your program as written (no rank program of clusterkit's before it), run by the supervisor itself.
    assert (launch.hosts, launch.agent, launch.ranks, launch.srun) == ("batch", False, "none", ())
    assert launch.argv == (FRONT_END, "{master_port}", ODD_ARG) and launch.expand == (1,)
    assert launch.env == {
        "NNODES": "2",
        "GPUS_PER_NODE": "2",
        "WORLD_SIZE": "4",
        "CLUSTERKIT_HOSTFILE": "{run_dir}/hostfile",
    }
    assert "CLUSTERKIT_HOSTFILE" in launch.env_expand


def test_a_script_front_end_is_run_as_a_program_too(tmp_path: Path) -> None:
    """GPT-NeoX's shape: `python3 deepy.py train.py config.yml` once, which starts DeepSpeed's launcher."""
    task = {"script": "python3", "args": ["./deepy.py", "train.py", "configs/125M.yml"]}
    launch = plan_of(render_job(load_recipe(_recipe(tmp_path, task=task)))).launch
    assert launch.argv == ("python3", "./deepy.py", "train.py", "configs/125M.yml") and launch.hosts == "batch"


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"srun": {"label": True}},
            "srun: launcher command in the batch shell starts the ranks with an srun of its own",
        ),
        ({"preflight": True}, "preflight: the preflight is not supported with process_model: batch_launcher"),
        (
            {"task": {"program": FRONT_END, "args": ["{node_rank}"]}},
            "task.args[0]: {node_rank} is known only in a task per rank",
        ),
        ({"resources": {"nodes": 2, "spare_nodes": 1, "time": "5"}}, "cannot move them to a spare"),
        ({"service": {"command": ["x"], "port": 9000}}, "a service role is not supported with launcher command"),
    ],
)
def test_what_a_front_end_in_the_batch_shell_cannot_do_is_refused(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **fields))
    assert message in str(raised.value)


def _assert_front_end_ran(run_dir: Path, hosts: list[str]) -> None:
    lines = (run_dir / "front_end.txt").read_text().splitlines()
    got = dict(line.split("=", 1) for line in lines if not line.startswith(("hostfile=", "arg=")))
    port = got["MASTER_PORT"]
    assert (
        got
        == {
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": port,
            "NNODES": "2",
            "GPUS_PER_NODE": "2",
            "WORLD_SIZE": "4",
            "CLUSTERKIT_HOSTFILE": f"{run_dir}/hostfile",
            "RUN_DIR": str(run_dir),
            "RANK": "unset",  # the front end is no rank: it starts them
            "NODE_RANK": "unset",
        }
        and port.isdigit()
    )
    assert [line for line in lines if line.startswith("hostfile=")] == [f"hostfile={host} slots=2" for host in hosts]
    assert [line for line in lines if line.startswith("arg=")] == [f"arg={port}", f"arg={ODD_ARG}"]
    ranks = sorted((run_dir / f"rank-{rank}").read_text().split() for rank in range(4))
    assert ranks == [[str(rank), hosts[rank // 2], f"{hosts[0]}:{port}"] for rank in range(4)]


def test_a_front_end_starts_every_rank_itself_on_the_local_executor(tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path)), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_front_end_ran(next((tmp_path / "runs" / "fe").iterdir()), ["127.0.0.1", "127.0.0.2"])


def test_a_front_end_that_cannot_start_fails_the_job_saying_so(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, task={"program": "./not-here"})
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode != 0 and "exit code 127" in done.stdout, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "fe").iterdir())
    batch_err = (run_dir / f"{run_dir.name}_0_log.err").read_text()
    assert "clusterkit: cannot start './not-here': No such file or directory" in batch_err
    assert "Traceback" not in batch_err


@pytest.mark.slurm
def test_a_front_end_starts_every_rank_itself_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path)), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_front_end_ran(next((tmp_path / "runs" / "fe").iterdir()), ["node1", "node2"])


def test_a_rendered_front_end_job_imports_back_to_the_same_launch(tmp_path: Path) -> None:
    rendered = tmp_path / "rendered"
    assert run_cli("render", str(_recipe(tmp_path)), "-o", str(rendered)).returncode == 0
    done = run_cli("import", str(rendered / "job.sbatch"), "--cluster", "dev", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "imported.yaml").write_text(done.stdout)
    again = plan_of(render_job(load_recipe(tmp_path / "imported.yaml"))).launch
    first = plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch
    assert (again.hosts, again.argv, again.env, again.srun) == (first.hosts, first.argv, first.env, first.srun)

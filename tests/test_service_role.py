"""The service role (issue 14): a command on nodes of its own in the same allocation, training on
the others with its world size, hostfile and rendezvous computed for the training nodes only; the
service's address reaches training in an env variable, training waits until it answers, and the
service is stopped when training ends."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from conftest import REPO, run_cli
from launch_plans import plan_of, started, task_argv

SCRIPT = str(REPO / "tests" / "scripts" / "use_service.py")


def _recipe(tmp_path: Path, service: dict, **fields) -> Path:
    body = {
        "name": "served",
        "cluster": "dev",
        "runs_dir": str(tmp_path / "runs"),
        "launcher": "python",
        "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "task": {"script": SCRIPT},
        "service": service,
        **fields,
    }
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _http_server(port: int) -> dict:
    return {
        "command": [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", str(port)],
        "port": port,
        "ready_timeout_s": 60,
    }


def test_the_allocation_holds_both_roles_and_training_runs_on_its_own_nodes(tmp_path: Path) -> None:
    job = render_job(load_recipe(_recipe(tmp_path, {**_http_server(8123), "nodes": 2})))
    assert "#SBATCH --nodes=3" in job.script  # 1 training node + 2 service nodes
    plan = plan_of(job)
    assert (plan.train_nodes, plan.service_nodes) == (1, 2)
    train, _ = started(plan, plan.launch, "/r")  # on an allocation of node1..node3
    service, _ = started(plan, plan.service.step, "/r")
    assert train[:5] == ["srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--nodelist=node1"]
    assert service[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node2,node3"]
    # One process per service node, given the node's CPUs (not a rank's share: launcher python runs 2 per node).
    assert "--cpus-per-task=2" in service and "--cpus-per-task=1" in train
    assert (plan.service.port, plan.service.address_env) == (8123, "SERVICE_ADDR")


@pytest.mark.parametrize(
    "fields, service, message",
    [
        (
            {"launcher": "deepspeed", "process_model": "batch_launcher"},
            {},
            "a service role is not supported with launcher deepspeed",
        ),
        ({}, {"address_env": "RANK"}, "service.address_env: RANK is set by clusterkit or SLURM"),
        # A name a program reads to decide how it starts: the address (host:port) written into it would change that.
        ({}, {"address_env": "LD_PRELOAD"}, "service.address_env: LD_PRELOAD: LD_* names are the dynamic loader's"),
        ({}, {"address_env": "LD_AUDIT"}, "service.address_env: LD_AUDIT: LD_* names are the dynamic loader's"),
        (
            {},
            {"address_env": "LD_LIBRARY_PATH"},
            "service.address_env: LD_LIBRARY_PATH: LD_* names are the dynamic loader's",
        ),
        ({}, {"address_env": "BASH_ENV"}, "service.address_env: BASH_ENV names a file every bash of the job runs"),
        ({}, {"address_env": "PS4"}, "service.address_env: PS4 "),
        ({}, {"address_env": "PYTHONSTARTUP"}, "service.address_env: PYTHONSTARTUP: PYTHON* names are Python's"),
        ({}, {"address_env": "PYTHONPATH"}, "service.address_env: PYTHONPATH: PYTHON* names are Python's"),
        ({}, {"address_env": "PATH"}, "service.address_env: PATH is set by"),
        ({}, {"address_env": "MANPATH"}, "service.address_env: MANPATH is a search path"),
        ({"env": {"SERVICE_ADDR": "x"}}, {}, "SERVICE_ADDR is also set in env"),
        ({}, {"command": []}, "service.command"),
    ],
)
def test_what_a_service_role_cannot_be_is_refused(tmp_path: Path, fields: dict, service: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, {**_http_server(8123), **service}, **fields))
    assert message in str(raised.value)


@pytest.mark.parametrize("name", ["SERVICE_ADDR", "MY_SERVER", "REDIS_URL", "OLD_SERVER", "PATHFINDER_ADDR"])
def test_a_name_of_its_own_is_the_address_variable(tmp_path: Path, name: str) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, {**_http_server(8123), "address_env": name}))))
    assert plan.service.address_env == name  # the supervisor sets it for the launch


def test_the_local_executor_refuses_a_service_role(tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path, _http_server(8123))), "--executor", "local", cwd=tmp_path)
    assert done.returncode == 2 and "the service role needs SLURM" in done.stderr


@pytest.mark.slurm
def test_training_reads_the_service_on_the_other_node_and_the_service_stops(dev_cluster: str, tmp_path: Path) -> None:
    port = random.randint(20000, 29999)
    done = run_cli("submit", str(_recipe(tmp_path, _http_server(port))), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "served").iterdir())
    seen = [json.loads((run_dir / f"service-seen-{rank}.json").read_text()) for rank in (0, 1)]
    service_node = seen[0]["address"].split(":")[0]
    assert {s["node"] for s in seen} == {"node1", "node2"} - {service_node}  # training had the other node
    assert all(
        s["address"] == f"{service_node}:{port}" and s["status"] == 200 and s["world"] == 2 and s["summed"] == 2
        for s in seen
    )
    assert (run_dir / "hostfile").read_text() == f"{seen[0]['node']} slots=2\n"  # the training nodes only
    assert (run_dir / "service_0.err").read_text().count('"GET / HTTP/1.1" 200') == 2
    log = next(run_dir.glob("*_0_log.out")).read_text()
    assert "clusterkit: the service answers at" in log and "clusterkit: service stopped" in log
    assert (run_dir / "exit_code").read_text().strip() == "0"


@pytest.mark.slurm
def test_a_service_that_never_answers_stops_the_job_before_training(dev_cluster: str, tmp_path: Path) -> None:
    service = {"command": ["sleep", "600"], "port": random.randint(30000, 31999), "ready_timeout_s": 3}
    done = run_cli("submit", str(_recipe(tmp_path, service)), "--follow", cwd=tmp_path)
    assert done.returncode == 1
    run_dir = next((tmp_path / "runs" / "served").iterdir())
    log = next(run_dir.glob("*_0_log.out")).read_text()
    assert "did not answer (not within 3 s): not training" in log and "clusterkit: service stopped" in log
    assert not list(run_dir.glob("service-seen-*")) and (run_dir / "exit_code").read_text().strip() == "1"


@pytest.mark.parametrize("word", ["a b", "it's", "$(touch {canary})", "`touch {canary}`;&|<>*?", "-x --y=z", "%j ~"])
def test_the_service_command_reaches_srun_word_for_word(tmp_path: Path, word: str) -> None:
    """The fuzz of every string field cannot reach a service's command (a service needs a port too),
    so its words are tried here: each arrives at srun as written, and nothing in it runs."""
    canary = tmp_path / "canary"
    word = word.format(canary=canary)
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, {"command": ["server", word], "port": 8123}))))
    assert task_argv(plan.service.step, str(tmp_path)) == ["server", word]  # what the node agent runs
    assert not canary.exists()
    with pytest.raises(RecipeError):
        load_recipe(_recipe(tmp_path, {"command": ["server", "a\nb"], "port": 8123}))

"""launcher: ray (issue 32): a Ray cluster on the allocation (the head on the first node, a worker on
each other one, the CPUs and GPUs declared from the allocation, Ray's temp dir and logs in the run
directory), the driver (the task's script) once every node joined, the job's exit code the driver's,
and no Ray process left on any node afterwards. What Ray cannot combine with is refused in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import clusterkit
from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.supervisor import ray_cluster
from clusterkit.supervisor.steps import free_port
from conftest import REPO, run_cli
from launch_plans import plan_of, started, task_argv

DRIVER = str(REPO / "tests" / "scripts" / "ray_driver.py")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the [ray] extra is not installed")


def _recipe(tmp_path: Path, code: int = 0, *then: str, **fields) -> Path:
    body = {
        "name": "rayjob",
        "cluster": "dev",
        "runs_dir": str(tmp_path / "runs"),
        "launcher": "ray",
        "resources": {"nodes": 2, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
        "task": {"script": DRIVER, "args": [str(code), *then]},
        **fields,
    }
    path = tmp_path / "rayjob.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_the_head_runs_on_the_first_node_a_worker_on_each_other_and_the_driver_in_the_batch_shell(
    tmp_path: Path,
) -> None:
    recipe = _recipe(
        tmp_path,
        resources={"nodes": 3, "gpus_per_node": 2, "cpus_per_task": 2, "time": "5"},
        launcher_args=["--object-store-memory=100000000"],
    )
    plan = plan_of(render_job(load_recipe(recipe)))
    assert plan.ray is not None and plan.ray.workers is not None
    head, _ = started(plan, plan.ray.head, "/r")
    workers, _ = started(plan, plan.ray.workers, "/r")
    assert head[:5] == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=node1"]
    assert workers[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node2,node3"]
    assert "--cpus-per-task=2" in head and "--output=/r/ray/worker_%t.out" in workers
    # Each node declares to Ray what the allocation gives it; the recipe's options come after.
    node = task_argv(plan.ray.workers, "/r")
    assert node[1:] == [
        "/r/supervisor",
        "ray-node",
        "worker",
        "--num-cpus=2",
        "--num-gpus=2",
        "--object-store-memory=100000000",
    ]
    assert task_argv(plan.ray.head, "/r")[2:4] == ["ray-node", "head"]
    driver, _ = started(plan, plan.launch, "/r")
    assert plan.launch.hosts == "batch" and driver[1:] == ["/r/code/tests/scripts/ray_driver.py", "0"]


def test_one_node_has_a_head_and_no_workers(tmp_path: Path) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, resources={"nodes": 1, "gpus_per_node": 1, "time": "5"}))))
    assert plan.ray is not None and plan.ray.workers is None


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"parallelism": {"tp": 2}}, "parallelism.tp: launcher: ray runs the task's script once as Ray's driver"),
        ({"parallelism": {"zero_stage": 2}}, "parallelism.zero_stage: launcher: ray runs"),
        ({"resources": {"nodes": 2, "spare_nodes": 1, "time": "5"}}, "resources.spare_nodes: launcher: ray puts"),
        ({"preflight": True}, "preflight: the preflight (torch.distributed ranks) is not supported with launcher: ray"),
        ({"master_port": 29500}, "master_port: launcher: ray chooses the head's port itself"),
        (
            {"service": {"command": ["sleep", "1"], "port": 8000}},
            "service: a service role is not supported with launcher: ray",
        ),
        (
            {"components": [{"name": "reward", "command": ["sleep", "1"], "nodes": 1, "port": 8000}]},
            "components: heterogeneous components are not supported with launcher: ray",
        ),
        (
            {"launcher_args": ["--num-cpus=8"]},
            "--num-cpus is written by clusterkit for ray; set resources.cpus_per_task",
        ),
        ({"launcher_args": ["--temp-dir", "/tmp/x"]}, "--temp-dir is written by clusterkit for ray"),
        ({"process_model": "task_per_gpu"}, "task_per_gpu is not how launcher ray starts ranks"),
        ({"task": {"script": DRIVER, "args": ["{node_rank}"]}}, "task.args[0]: {node_rank} is known only on a node"),
        ({"task": {"program": "/bin/true"}}, "task.program: launcher ray runs Python"),
    ],
)
def test_what_ray_cannot_combine_with_is_refused_in_one_line(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(RecipeError) as refused:
        load_recipe(_recipe(tmp_path, **fields))
    assert message in str(refused.value)


def test_a_step_cannot_be_ray_and_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    steps = [{"name": "rl", "launcher": "ray", "task": {"script": DRIVER}}]
    recipe = _recipe(tmp_path, launcher="python", steps=steps)
    body = yaml.safe_load(recipe.read_text())
    del body["task"]
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("validate", str(recipe), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "steps[0].launcher: launcher: ray is not supported in a job of several steps" in lines[0]


def test_ray_runs_in_the_run_directory_where_its_socket_paths_fit(tmp_path: Path) -> None:
    short = Path("/tmp") / f"ck{os.getpid()}"
    try:
        assert ray_cluster.temp_dir(short / "ray" / "node1") == (short / "ray" / "node1", False)
    finally:
        subprocess.run(["rm", "-rf", str(short)], check=True)


def test_a_deep_run_directory_gets_a_private_temp_dir_and_the_logs_come_back(tmp_path: Path) -> None:
    wanted = tmp_path / ("d" * 60) / "ray" / "node1"
    temp, elsewhere = ray_cluster.temp_dir(wanted)
    assert elsewhere and len(str(temp)) + ray_cluster.SOCKET_TAIL <= ray_cluster.SOCKET_PATH_MAX
    assert stat.S_IMODE(temp.stat().st_mode) == 0o700  # nobody else's to write into (mkdtemp)
    (temp / "session_1" / "logs").mkdir(parents=True)
    (temp / "session_1" / "logs" / "raylet.out").write_text("raylet says\n")
    (temp / "session_latest").symlink_to(temp / "session_1")
    ray_cluster._keep_logs(temp, wanted)
    assert (wanted / "logs" / "raylet.out").read_text() == "raylet says\n" and not temp.exists()


def _ray_processes_of(run_dir: Path) -> list[str]:
    """Ray's processes (and any other) still running with the run's RUN_DIR in their environment."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"RUN_DIR={run_dir}".encode() in environ:
            left.append(f"{pid} {cmdline}")
    return left


def _check_ray_job(run_dir: Path, nodes: int) -> None:
    seen = json.loads((run_dir / "ray-driver.json").read_text())
    assert len(seen["nodes"]) == nodes  # ray.nodes(): every node alive before the driver started
    assert {node["resources"].get("CPU") for node in seen["nodes"]} == {1.0}
    assert {node["resources"].get("GPU") for node in seen["nodes"]} == {1.0}  # declared from the allocation
    tasks = seen["tasks"]
    assert len({task["node_id"] for task in tasks}) == nodes and len({task["ip"] for task in tasks}) == nodes
    log = next(run_dir.glob("*_log.out")).read_text()
    assert "clusterkit: Ray has all 2 nodes" in log and "clusterkit: Ray stopped on every node" in log
    assert list((run_dir / "ray").glob("*/logs/raylet.out")), sorted((run_dir / "ray").rglob("*"))[:20]
    assert seen["raylets"] == nodes  # while the driver ran, seen by what looks for them now
    assert _ray_processes_of(run_dir) == []


@needs_ray
@pytest.mark.parametrize("code", [0, 3])
def test_a_local_ray_job_runs_its_driver_on_two_nodes_and_leaves_no_ray_process(tmp_path: Path, code: int) -> None:
    done = run_cli("submit", str(_recipe(tmp_path, code)), "--executor", "local", "--follow", cwd=tmp_path, timeout=300)
    assert done.returncode == min(code, 1) and f"(exit code {code})" in done.stdout, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "rayjob").iterdir())
    assert (run_dir / "exit_code").read_text().strip() == str(code)  # the driver's
    _check_ray_job(run_dir, 2)


@needs_ray
@pytest.mark.slurm
@pytest.mark.parametrize("code", [0, 5])
def test_ray_on_two_slurm_nodes(dev_cluster: str, tmp_path: Path, code: int) -> None:
    done = run_cli("submit", str(_recipe(tmp_path, code)), "--follow", cwd=tmp_path, timeout=400)
    assert done.returncode == min(code, 1) and f"(exit code {code})" in done.stdout, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "rayjob").iterdir())
    assert (run_dir / "exit_code").read_text().strip() == str(code)
    _check_ray_job(run_dir, 2)
    # The dev cluster's nodes share this machine: each Ray node has its node's own address.
    ips = {task["ip"] for task in json.loads((run_dir / "ray-driver.json").read_text())["tasks"]}
    assert len(ips) == 2 and ips <= {"127.0.0.11", "127.0.0.12", "127.0.0.13"}, ips


@needs_ray
def test_a_head_that_cannot_start_ends_the_job_before_the_driver(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, 0, launcher_args=["--no-such-ray-option"])
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "rayjob").iterdir())
    log = next(run_dir.glob("*_log.out")).read_text()
    assert "Ray's head did not answer (it ended; its output: ray/head_0.err): not running the driver" in log
    assert "clusterkit: Ray stopped on every node" in log and not (run_dir / "ray-driver.json").exists()
    assert "No such option" in (run_dir / "ray" / "head_0.err").read_text()
    assert (run_dir / "exit_code").read_text() == "1\n" and _ray_processes_of(run_dir) == []


@needs_ray
def test_the_preemption_signal_reaches_the_driver_while_ray_stays_up_then_ray_stops(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, 0, "await-preemption")
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)["run"]
    run_dir = Path(record["run_dir"])
    deadline = time.monotonic() + 180
    while not (run_dir / "ray-driver.ready").exists():
        assert time.monotonic() < deadline, sorted(os.listdir(run_dir))
        time.sleep(0.5)
    os.kill(record["pid"], signal.SIGUSR2)  # as SLURM's --signal=B:USR2: to the batch process only
    # The job's end, not its exit code's: the supervisor goes on after writing it (post_run, Ray's stop).
    assert clusterkit.find_run(str(run_dir)).wait(timeout=180).state == "COMPLETED"
    assert (run_dir / "ray-driver.preempted").read_text() == "2"  # Ray's processes ignored it
    assert (run_dir / "exit_code").read_text() == "0\n"
    _check_ray_job(run_dir, 2)


class _Step:
    """A started Ray step that ends (or not) when its node sees the stop file."""

    def __init__(self, ends: bool) -> None:
        self.ends, self.waited, self.ended_by_srun = ends, [], False

    def poll(self, timeout_s: float):
        self.waited.append(timeout_s)
        return 0 if self.ends else None

    def stop(self) -> int:
        self.ended_by_srun = True
        return 143


def test_a_node_that_does_not_stop_its_ray_in_time_is_ended_through_srun(tmp_path: Path) -> None:
    (tmp_path / "ray").mkdir()
    cluster = ray_cluster.Cluster("127.0.0.1:20001", str(tmp_path))
    head, workers = _Step(ends=True), _Step(ends=False)
    cluster.steps = [head, workers]  # type: ignore[list-item]
    now = iter([0.0, 0.0, 61.0])
    cluster.stop(clock=lambda: next(now))
    assert (tmp_path / "ray" / "stop").exists()  # what every node watches for
    assert workers.waited == [ray_cluster.STOP_TIMEOUT_S] and workers.ended_by_srun  # the workers first
    assert head.waited == [0.0] and not head.ended_by_srun  # the time left: none, but it had ended


@pytest.mark.parametrize("word", ['--resources={"a": 1}', "--labels=$(touch /tmp/pwned)", "--x=a\nb", "--y=~ % -"])
def test_a_launcher_arg_reaches_ray_start_word_for_word(tmp_path: Path, word: str) -> None:
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, launcher_args=[word]))))
    assert plan.ray is not None and plan.ray.workers is not None
    for step in (plan.ray.head, plan.ray.workers):
        assert task_argv(step, "/r")[-1] == word


def test_the_dry_run_shows_the_ray_steps_and_the_driver_once(tmp_path: Path) -> None:
    done = run_cli("submit", str(_recipe(tmp_path)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(("# ray-", "# launch:"))]
    assert [line.split(":")[0] for line in lines] == ["# ray-head", "# ray-worker", "# launch"], lines
    assert "1 x 1 task(s) per node: python3 '{run_dir}/supervisor' ray-node head --num-cpus=1 --num-gpus=1" in lines[0]
    assert lines[2].startswith("# launch: 1 x 1 task(s) per node in the batch shell: python3")


def test_the_heads_port_is_above_rays_worker_ports_and_moves_off_a_busy_one() -> None:
    def port(job_id: str, busy: set[int] = frozenset()) -> int:  # type: ignore[assignment]
        return free_port(job_id, "h", lambda host, p: p in busy, first=ray_cluster.PORTS_FROM, count=ray_cluster.PORTS)

    assert [port(job) for job in ("1", "9999", "10000", "123456")] == [20001, 29999, 20000, 23456]
    assert port("4242", {24242}) == 24242 + 997  # Ray's workers take 10002-19999 on every node

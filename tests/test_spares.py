"""Hot spares, in one process against the fake job environment: a launch that fails on a node starts
again in the same job on a spare (that node dropped, the rendezvous and hostfile moved), each restart
recorded; without a spare or restart left, the retry as a new job excludes every dropped node; a
preempted launch is never restarted. The whole path on the dev cluster: test_spares_slurm.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from clusterkit.runs.status import COMPLETED, JobStatus, explained, restart_lines
from clusterkit.supervisor.plan import Recovery, Watchdog
from conftest import REPO, run_cli
from test_stacks import HANGING, DumpingJob, _record
from test_supervisor import FakeJob, _plan, _step, _supervise


def _fails_once_on(run_dir: Path, node: int, times: int = 1) -> str:
    """The launch: fails on ``node`` the first ``times`` starts (its node record first), then succeeds."""
    return (
        f"n=$(cat {run_dir}/starts 2>/dev/null || echo 0); echo $((n+1)) > {run_dir}/starts; "
        f"if [ $n -lt {times} ]; then mkdir -p {run_dir}/ranks; echo '1.0 137' > {run_dir}/ranks/node{node}.exit; "
        f"echo '2.0 1' > {run_dir}/ranks/node0.exit; exit 1; fi; sleep 0.6; touch {run_dir}/heartbeat; sleep 0.8"
    )


def _spare_plan(max_restarts: int = 1, max_retries: int = 0, **fields):
    recovery = Recovery(signal="USR2", max_requeues=0, max_retries=max_retries, max_restarts=max_restarts)
    return _plan(spare_nodes=1, recovery=recovery, **fields)


def _launches(job: FakeJob) -> list[tuple[list[str], dict[str, str]]]:
    return [(argv, env) for name, argv, env in job.started if name == "launch"]


def test_a_node_failure_restarts_the_launch_on_the_spare_in_the_same_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({"launch": _fails_once_on(run_dir, 1)})  # hosts n1 n2 n3: training n1 n2, spare n3
    code, _ = _supervise(tmp_path, _spare_plan(), job)
    assert code == 0 and job.submitted == []  # no new job
    (first, _), (second, env) = _launches(job)
    assert "--nodelist=n1,n2" in first and "--nodelist=n1,n3" in second
    assert env["MASTER_ADDR"] == "n1" and (run_dir / "hostfile").read_text() == "n1 slots=2\nn3 slots=2\n"
    restart, resumed = [json.loads(line) for line in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert resumed["restart"] == 1 and resumed["resumed_at"] > restart["restarted_at"]
    assert restart["restart"] == 1 and restart["dropped"] == ["n2"] and restart["job_id"] == "4242"
    assert restart["failed_at"] == 1.0 and restart["restarted_at"] > 1.0
    assert "its failure began on n2" in restart["why"]
    assert not (run_dir / "ranks" / "node1.exit").exists()  # the second launch's failures are its own
    status = explained(_record(run_dir), JobStatus(COMPLETED, 0))
    assert [r["dropped"] for r in status.restarts] == [["n2"]]
    assert status.restarts[0]["lost_s"] > 0  # from the failure (1.0: 1970) to the first step after
    (line,) = restart_lines(status.restarts)
    assert line.startswith("restart 1 at ") and "on a spare: dropped n2: the launch exited with 1" in line
    assert line.endswith(" s lost")


def test_the_master_moves_when_the_first_node_fails(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({"launch": _fails_once_on(run_dir, 0).replace("node0.exit; exit", "node9.exit; exit")})
    code, _ = _supervise(tmp_path, _spare_plan(), job)
    (_, _), (second, env) = _launches(job)
    assert code == 0 and "--nodelist=n2,n3" in second and env["MASTER_ADDR"] == "n2"


def test_without_a_restart_left_the_retry_is_a_new_job_without_every_dropped_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({"launch": _fails_once_on(run_dir, 1, times=5)})
    code, _ = _supervise(tmp_path, _spare_plan(max_restarts=1, max_retries=1), job)
    assert code == 1 and len(_launches(job)) == 2  # the first start and one restart
    ((argv, _env),) = job.submitted
    assert "--exclude=n2,n3" in argv  # dropped for the spare, then where the restart failed


def test_no_restart_without_a_spare_to_take_or_for_a_preempted_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = FakeJob({"launch": _fails_once_on(run_dir, 1)}, hosts=["n1", "n2"])  # the spare never came
    code, _ = _supervise(tmp_path, _spare_plan(), job)
    assert code == 1 and len(_launches(job)) == 1
    preempted = tmp_path / "p"
    (preempted / "run").mkdir(parents=True)
    behaviour = _fails_once_on(preempted / "run", 1).replace(
        "exit 1; fi", f"echo '{{\"step\": 3}}' > {preempted}/run/preempted.json; exit 1; fi"
    )
    job = FakeJob({"launch": behaviour})
    _supervise(preempted, _spare_plan(), job)
    assert len(_launches(job)) == 1


def test_a_hang_with_action_retry_drops_the_odd_ranks_node_for_the_spare(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    behaviour = f"if [ -e {run_dir}/hung ]; then exit 0; fi; touch {run_dir}/hung; sleep 30"
    job = DumpingJob({"launch": behaviour}, HANGING, run_dir)  # rank 2 on node 1 (n2) is elsewhere
    plan = _spare_plan(watchdog=Watchdog(no_progress_s=60, startup_s=1, action="retry"))
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 0 and job.submitted == []
    restart = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[0])
    assert restart["dropped"] == ["n2"] and "--nodelist=n1,n3" in _launches(job)[1][0]
    assert not (run_dir / "hang.json").exists()  # the job recovered: status says restart, not HUNG


def test_on_the_local_executor_the_spare_takes_over_with_real_processes(tmp_path: Path) -> None:
    body = {
        "name": "spare",
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 2, "spare_nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
        "task": {"script": str(REPO / "tests" / "scripts" / "die_on_node1_once.py")},
        "snapshot": False,
    }
    recipe = tmp_path / "spare.yaml"
    recipe.write_text(yaml.safe_dump(body))
    done = run_cli("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = Path(json.loads(done.stdout)["run"]["run_dir"])
    deadline = time.monotonic() + 60
    while not (run_dir / "exit_code").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (run_dir / "exit_code").read_text() == "0\n"
    assert (run_dir / "died").read_text() == "127.0.0.2"
    assert {(run_dir / f"ran-on-{rank}").read_text() for rank in (0, 1)} == {"127.0.0.1", "127.0.0.3"}
    restart = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[0])
    assert restart["dropped"] == ["127.0.0.2"]


def test_nodes_the_preflight_finds_slow_are_swapped_for_spares_before_training(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    preflight = (
        f"if [ -e {run_dir}/checked ]; then echo '{{\"slow_nodes\": []}}' > {run_dir}/preflight.json; exit 0; fi; "
        f"touch {run_dir}/checked; echo '{{\"slow_nodes\": [1]}}' > {run_dir}/preflight.json; exit 1"
    )
    job = FakeJob({"preflight": preflight})
    recovery = Recovery(signal="USR2", max_requeues=0, max_retries=0, max_restarts=1, slow_nodes_excluded=True)
    plan = _plan(spare_nodes=1, recovery=recovery, preflight=_step("preflight"))
    code, _ = _supervise(tmp_path, plan, job)
    assert code == 0
    steps = [(name, next(w for w in argv if w.startswith("--nodelist="))) for name, argv, _ in job.started]
    assert steps == [
        ("preflight", "--nodelist=n1,n2"),
        ("preflight", "--nodelist=n1,n3"),
        ("launch", "--nodelist=n1,n3"),
    ]
    restart = json.loads((run_dir / "restarts.jsonl").read_text())
    assert restart["dropped"] == ["n2"] and restart["why"] == "the preflight found n2 slow"

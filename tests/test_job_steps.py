"""Several steps in one allocation (issue 31, ``steps:``): a data step, training, an evaluation run as
trials, each an srun step of its own with its own launcher, options, env and logs; the first that
fails ends the job with its exit code, the steps after it never start, and ``status`` names it.
Validated (each step's keys in its errors), planned, supervised against a fake job, and run end to
end on the local executor (and on the dev cluster, marked slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.supervisor import steps
from clusterkit.supervisor.plan import Service, expand, load_plan
from conftest import REPO, run_cli
from launch_plans import plan_of
from test_supervisor import FakeJob, _plan, _step, _supervise

PROBE = str(REPO / "tests" / "scripts" / "step_probe.py")


def _steps(train_exit: int = 0, **fields) -> dict:
    """prep (one node), train (every node), eval (three trials, a seed each)."""
    return {
        "name": "steps",
        "cluster": "dev",
        "resources": {"nodes": 2, "gpus_per_node": 1, "time": "5"},
        "launcher": "python",
        "steps": [
            {"name": "prep", "nodes": 1, "task": {"script": PROBE, "args": ["prep"]}},
            {
                "name": "train",
                "task": {"script": PROBE, "args": ["--exit", str(train_exit)]},
                "env": {"SEED": "{trial}"},
            },
            {"name": "eval", "repeat": 3, "task": {"script": PROBE, "args": ["--seed={trial}"]}, "env": {"SEED": 7}},
        ],
        **fields,
    }


def _write(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _error(tmp_path: Path, body: dict) -> str:
    """The one line ``validate`` prints for the recipe (exit 2, nothing else)."""
    done = run_cli("validate", str(_write(tmp_path, body)))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


# --- validation ------------------------------------------------------------------------------------


def test_task_and_steps_together_are_one_line(tmp_path: Path) -> None:
    line = _error(tmp_path, {**_steps(), "task": {"script": PROBE}})
    assert line.endswith(
        "task: give either task: (a job of one step) or steps: (several, each with its own task and task.args), not both"
    )
    written = (tmp_path / "steps.yaml").read_text().splitlines().index("task:") + 1
    assert f":{written}: task:" in line  # where task: is written


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (lambda s: s[1].update(name="prep"), "steps[1].name", "another step is named prep"),
        (lambda s: s[0].update(name="launch"), "steps[0].name", "launch names a step clusterkit runs itself"),
        (lambda s: s[0].update(nodes=3), "steps[0].nodes", "at most resources.nodes (2)"),
        (lambda s: [step.update(nodes=1) for step in s], "steps[0].nodes", "needs a step on all resources.nodes"),
        (lambda s: s[2]["task"].update(script=None), "steps[2].task", "give exactly one of task.trainer"),
        (lambda s: s[2].update(env={"RANK": "1"}), "steps[2].env.RANK", "RANK is set by"),
        (lambda s: s[2].update(env={"CLUSTERKIT_TRIAL": "1"}), "steps[2].env.CLUSTERKIT_TRIAL", "set by clusterkit"),
        (lambda s: s[2].update(srun={"extra": {"nodelist": "x"}}), "steps[2].srun.extra.nodelist", "given to the"),
        (lambda s: s[2].update(launcher_args=["--x"]), "steps[2].launcher_args", "launcher python takes no"),
        (lambda s: s[0]["task"].update(module=True), "steps[0].task.script", "must be a dotted module name"),
    ],
)
def test_each_step_is_checked_at_its_own_keys(tmp_path: Path, change, key: str, message: str) -> None:
    body = _steps()
    change(body["steps"])
    line = _error(tmp_path, body)
    assert f": {key}: " in line and message in line, line


def test_a_step_launcher_of_the_same_process_model_is_fine(tmp_path: Path) -> None:
    body = _steps(launcher="torchrun")
    body["steps"][0].update(launcher="command")  # a node's program, as torchrun is
    loaded = load_recipe(_write(tmp_path, body))
    assert [(s.launcher, s.process_model, s.nodes) for s in loaded.recipe.steps] == [
        ("command", "launcher_per_node", 1),
        ("torchrun", "launcher_per_node", 2),
        ("torchrun", "launcher_per_node", 2),
    ]


def test_a_step_may_start_fewer_tasks_per_node_than_the_allocation_not_more(tmp_path: Path) -> None:
    body = _steps(launcher="torchrun", resources={"nodes": 2, "gpus_per_node": 2, "time": "5"})
    body["steps"][2]["launcher"] = "python"  # a task per rank: 2 per node, the allocation has 1
    assert ": steps[2].launcher: launcher python starts a task per rank (task_per_gpu)" in _error(tmp_path, body)
    body = _steps(resources={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"})  # python: 2 per node
    body["steps"][0]["launcher"] = "command"  # once per node, with the node's CPUs
    plan = plan_of(render_job(load_recipe(_write(tmp_path, body))))
    prep, train, _ = plan.steps
    assert (prep.tasks_per_node, train.tasks_per_node) == (1, 2)
    assert "--cpus-per-task=2" in prep.srun and "--cpus-per-task=1" in train.srun


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"preemption": {"max_retries": 1}}, "preemption.max_retries"),
        ({"resources": {"nodes": 2, "gpus_per_node": 1, "spare_nodes": 1}}, "resources.spare_nodes"),
        ({"watchdog": {"no_progress": "10m"}}, "watchdog"),
        ({"snapshot": True}, "snapshot"),
    ],
)
def test_what_steps_cannot_carry_yet_is_refused_with_why(tmp_path: Path, fields: dict, key: str) -> None:
    line = _error(tmp_path, _steps(**fields))
    assert f": {key}: " in line and "steps" in line, line


def test_arguments_after_dashes_are_refused_for_steps(tmp_path: Path) -> None:
    done = run_cli("render", str(_write(tmp_path, _steps())), "-o", str(tmp_path / "out"), "--", "--extra")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert done.stderr.strip() == (
        "the arguments after --: task.args: give either task: (a job of one step) or steps: (several, each with "
        "its own task and task.args), not both"
    )


def test_a_chain_of_steps_is_refused(tmp_path: Path) -> None:
    done = run_cli("submit", str(_write(tmp_path, _steps())), "--chain", "2", "--dry-run")
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "--chain: each link would run every step again; not with steps: yet"
    )


def test_trial_outside_steps_is_refused(tmp_path: Path) -> None:
    body = {"name": "one", "cluster": "dev", "task": {"script": PROBE, "args": ["--seed={trial}"]}}
    assert "task.args[0]: {trial} is the trial number of a step" in _error(tmp_path, body)
    body = {"name": "one", "cluster": "dev", "task": {"script": PROBE}, "env": {"S": "{trial}"}}
    assert "env.S: {trial} is the trial number" in _error(tmp_path, body)
    body = {"name": "one", "cluster": "dev", "task": {"script": PROBE}, "launcher_args": ["--x={trial}"]}
    assert "launcher_args[0]: {trial} is the trial number" in _error(tmp_path, body)


TRAINER = {"model": {"config": {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 32}}}


def test_the_built_in_trainer_is_the_training_step_and_job_json_holds_its_task(tmp_path: Path) -> None:
    body = _steps()
    body["steps"][1]["task"] = {"trainer": {**TRAINER, "args": {"max_steps": 1}}}
    loaded = load_recipe(_write(tmp_path, body))
    assert loaded.recipe.task.trainer is not None and loaded.recipe.task == loaded.recipe.steps[1].task
    body["steps"][1]["task"]["trainer"]["args"] = {"bf16": True}  # owned by precision: at the step's key
    line = _error(tmp_path, body)
    assert ": steps[1].task.trainer.args.bf16: set by clusterkit from precision" in line, line


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (lambda s: s[1].update(repeat=2), "steps[1].repeat", "each trial would resume the one before"),
        (lambda s: s[2].update(task={"trainer": TRAINER}, repeat=1), "steps[2].task.trainer", "only one step can run"),
        (lambda s: s[1].update(nodes=1), "steps[1].nodes", "the built-in trainer trains with the recipe's layout"),
    ],
)
def test_the_built_in_trainer_step_is_one_whole_run(tmp_path: Path, change, key: str, message: str) -> None:
    body = _steps()
    body["steps"][1]["task"] = {"trainer": TRAINER}
    change(body["steps"])
    line = _error(tmp_path, body)
    assert f": {key}: " in line and message in line, line


def test_a_recipe_without_steps_plans_none(tmp_path: Path) -> None:
    body = {"name": "one", "cluster": "dev", "task": {"script": PROBE}}
    plan = plan_of(render_job(load_recipe(_write(tmp_path, body))))
    assert plan.steps == () and plan.launch.repeat == 1


# --- the plan --------------------------------------------------------------------------------------


def test_the_plan_has_each_step_with_its_layout_logs_env_and_trials(tmp_path: Path) -> None:
    job = render_job(load_recipe(_write(tmp_path, _steps())))
    plan = plan_of(job)
    assert load_plan(plan.to_json()) == plan
    prep, train, eval_ = plan.steps
    assert [(s.name, s.nodes, s.tasks_per_node, s.repeat) for s in plan.steps] == [
        ("prep", 1, 1, 1),
        ("train", 2, 1, 1),
        ("eval", 2, 1, 3),
    ]
    assert prep.logs == ("steps/prep/%j_%t_log.out", "steps/prep/%j_%t_log.err")
    assert eval_.logs == ("steps/eval/{trial}/%j_%t_log.out", "steps/eval/{trial}/%j_%t_log.err")
    assert prep.env["WORLD_SIZE"] == "1" and train.env["WORLD_SIZE"] == "2"  # each step's own world
    assert train.env["SEED"] == "{trial}" and "SEED" in train.env_expand
    assert eval_.env["SEED"] == "7" and "SEED" not in eval_.env_expand
    seed = eval_.argv.index("--seed={trial}")
    assert seed in eval_.expand and expand(eval_.argv[seed], {"trial": "2"}) == "--seed=2"


def test_the_dry_run_shows_each_step_in_order(tmp_path: Path) -> None:
    done = run_cli("submit", str(_write(tmp_path, _steps())), "--dry-run")
    shown = [
        line for line in done.stderr.splitlines() if line.startswith(("# prep:", "# train:", "# eval:", "# launch:"))
    ]
    assert [line.split(":")[0] for line in shown] == ["# prep", "# train", "# eval"], done.stderr
    assert shown[0].startswith("# prep: 1 x 1 task(s) per node: ")
    assert shown[2].startswith("# eval: 2 x 1 task(s) per node, 3 trials: ") and "'--seed={trial}'" in shown[2]


def test_each_step_gets_its_own_srun_options(tmp_path: Path) -> None:
    body = _steps(srun={"label": True})
    body["steps"][2]["srun"] = {"cpu_bind": "none"}
    plan = plan_of(render_job(load_recipe(_write(tmp_path, body))))
    assert "--label" in plan.steps[1].srun and "--label" not in plan.steps[2].srun
    assert "--cpu-bind=none" in plan.steps[2].srun


def test_hostile_step_values_stay_words(tmp_path: Path) -> None:
    hostile = "$(touch /tmp/ck-steps-canary) ; `id` '\"{trial}"
    body = _steps()
    body["steps"][2]["task"]["args"] = [hostile]
    body["steps"][2]["env"] = {"HOSTILE": hostile}
    job = render_job(load_recipe(_write(tmp_path, body)))
    plan = plan_of(job)
    assert hostile in plan.steps[2].argv and plan.steps[2].env["HOSTILE"] == hostile
    assert hostile not in job.files["job.sbatch"]  # the plan carries it, no shell reads it
    for name in ("a b", "a/b", "../x", "-x", "x\n", "{trial}"):
        body = _steps()
        body["steps"][0]["name"] = name
        assert ": steps[0].name: " in _error(tmp_path, body)


# --- the supervisor ----------------------------------------------------------------------------------


def _three(tmp_path: Path) -> dict:
    return {
        "steps": (
            _step("prep", nodes=1, logs=("steps/prep/%j_%t_log.out", "steps/prep/%j_%t_log.err")),
            _step("train", logs=("steps/train/%j_%t_log.out", "steps/train/%j_%t_log.err")),
            _step("eval", repeat=2, logs=("steps/eval/{trial}/%j.out", "steps/eval/{trial}/%j.err")),
        )
    }


def test_the_first_failing_step_ends_the_job_with_its_code(tmp_path: Path) -> None:
    job = FakeJob({"train": "exit 3"})
    code, run_dir = _supervise(tmp_path, _plan(**_three(tmp_path)), job)
    assert code == 3 and (run_dir / "exit_code").read_text() == "3\n"
    assert [name for name, _, _ in job.started] == ["prep", "train"]  # eval never started
    ends = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [(e["step"], e["exit_code"]) for e in ends if "exit_code" in e] == [("prep", 0), ("train", 3)]


def test_trials_run_in_turn_each_told_its_number_with_its_own_logs(tmp_path: Path) -> None:
    job = FakeJob({})
    code, run_dir = _supervise(tmp_path, _plan(**_three(tmp_path)), job)
    assert code == 0
    trials = [(argv, env) for name, argv, env in job.started if name == "eval"]
    assert [env["CLUSTERKIT_TRIAL"] for _, env in trials] == ["0", "1"]
    assert {env["CLUSTERKIT_STEP"] for _, env in trials} == {"eval"}
    assert [next(w for w in argv if w.startswith("--output=")) for argv, _ in trials] == [
        f"--output={run_dir}/steps/eval/0/%j.out",
        f"--output={run_dir}/steps/eval/1/%j.out",
    ]
    assert (run_dir / "steps" / "eval" / "1").is_dir()  # made before srun opens its logs there
    assert next(argv for name, argv, _ in job.started if name == "prep")[1:4] == [
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
    ]


def test_a_requeued_job_goes_on_from_the_step_that_was_preempted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    preempted = f"echo '{{\"step\": 7}}' > {run_dir}/preempted.json; exit 0"
    job = FakeJob({"train": preempted})
    code, _ = _supervise(tmp_path, _plan(**_three(tmp_path)), job)
    assert code == 0 and job.requeued == ["4242"]  # stopped to be requeued, eval not started
    assert [name for name, _, _ in job.started] == ["prep", "train"]
    again = FakeJob({}, {"SLURM_RESTART_COUNT": "1"})
    code, _ = _supervise(tmp_path, _plan(**_three(tmp_path)), again)
    assert code == 0 and [name for name, _, _ in again.started] == ["train", "eval", "eval"]
    other_job = FakeJob({}, {"SLURM_JOB_ID": "5151"})  # another job in this run dir completed nothing
    _supervise(tmp_path, _plan(**_three(tmp_path)), other_job)
    assert [name for name, _, _ in other_job.started] == ["prep", "train", "eval", "eval"]


def test_a_service_serves_every_step_and_stops_after_the_last(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(steps, "answers", lambda host, port, timeout_s=1.0: (host, port) == ("n3", 9))
    service = Service(step=_step("service", hosts="service", nodes=1), port=9, ready_timeout_s=60, address_env="ADDR")
    job = FakeJob({"service": "sleep 30", "eval": "exit 4"})
    code, _ = _supervise(tmp_path, _plan(service=service, service_nodes=1, **_three(tmp_path)), job)
    assert code == 4 and [name for name, _, _ in job.started] == ["service", "prep", "train", "eval"]
    assert {env["ADDR"] for name, _, env in job.started[1:]} == {"n3:9"}
    assert next(argv for name, argv, _ in job.started if name == "train")[4] == "--nodelist=n1,n2"


@pytest.mark.parametrize(
    ("lines", "state", "reason", "failure"),
    [
        ([{"step": "train", "trial": 0, "repeat": 1}], "RUNNING", "step train running", None),
        ([{"step": "eval", "trial": 1, "repeat": 3}], "RUNNING", "step eval trial 1 (of 3) running", None),
        (
            [{"step": "eval", "trial": 2, "repeat": 3, "exit_code": 5}],
            "FAILED",
            None,
            "step eval trial 2 (of 3) exited with 5 (logs in steps/eval/2/)",
        ),
        (
            [{"step": "train\x1b[31m", "trial": 0, "repeat": 1, "exit_code": 1}],
            "FAILED",
            None,
            "step train [31m exited",
        ),
        ([{"step": "x", "trial": "0; rm", "repeat": 1, "exit_code": 1}], "FAILED", None, None),  # not the supervisor's
        ([{"step": "train", "trial": 0, "repeat": 1, "exit_code": 0}], "RUNNING", None, None),  # between two steps
    ],
)
def test_status_says_which_step_runs_or_failed(tmp_path: Path, lines, state: str, reason, failure) -> None:
    from clusterkit.runs.record import RunRecord
    from clusterkit.runs.status import JobStatus, explained

    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"cut')
    record = RunRecord("7", "steps", "local", str(tmp_path), "r.yaml", 0.0, 2, 1, "python")
    found = explained(record, JobStatus(state, 5 if state == "FAILED" else None))
    assert found.reason == reason
    assert (found.failure or "").startswith(failure or "") and (failure is not None) == (found.failure is not None)


# --- end to end ----------------------------------------------------------------------------------


def _probes(run_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (run_dir / "probe").glob("*.json")}


def test_a_failing_middle_step_on_the_local_executor(tmp_path: Path) -> None:
    """prep, train (exits 3), eval: the job's exit code is 3, eval never ran, status names train."""
    runs = tmp_path / "runs"
    recipe = _write(tmp_path, _steps(train_exit=3, runs_dir=str(runs)))
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = next((runs / "steps").iterdir())
    assert (run_dir / "exit_code").read_text() == "3\n"
    assert sorted(_probes(run_dir)) == ["prep-0-0", "train-0-0", "train-0-1"]  # eval never ran
    assert (
        run_dir / "steps" / "prep" / f"{run_dir.name}_0_log.out"
    ).read_text() == "step_probe: step prep trial 0 rank 0\n"
    assert not (run_dir / "steps" / "eval").exists()
    status = run_cli("status", run_dir.name, "--runs-dir", str(runs), "--json")
    found = json.loads(status.stdout)
    assert found["state"] == "FAILED" and found["exit_code"] == 3
    assert found["failure"].startswith("step train exited with 3 (logs in steps/train/)"), found["failure"]
    shown = run_cli("status", run_dir.name, "--runs-dir", str(runs)).stdout
    assert "first failure: step train exited with 3" in shown


def test_trials_on_the_local_executor_each_with_its_seed_and_logs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    recipe = _write(tmp_path, _steps(runs_dir=str(runs)))
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((runs / "steps").iterdir())
    probes = _probes(run_dir)
    assert probes["train-0-1"]["seed"] == "0"  # env {trial}: the step's one run
    for trial in range(3):
        for rank in range(2):
            seen = probes[f"eval-{trial}-{rank}"]
            assert seen["argv"] == [f"--seed={trial}"] and seen["seed"] == "7"
        log = run_dir / "steps" / "eval" / str(trial) / f"{run_dir.name}_1_log.out"
        assert log.read_text() == f"step_probe: step eval trial {trial} rank 1\n"
    assert (run_dir / "exit_code").read_text() == "0\n"


@pytest.mark.slurm
def test_a_failing_middle_step_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    """As on the local executor, under real SLURM: each step an srun step of the one allocation. A
    step's exit code is its srun's, the highest of its tasks': with kill_on_bad_exit, a rank that
    SLURM ends because the other failed first counts 143 there, so here both ranks end by themselves."""
    runs = tmp_path / "runs"
    body = _steps(train_exit=3, runs_dir=str(runs))
    body["steps"][1]["srun"] = {"kill_on_bad_exit": False}
    recipe = _write(tmp_path, body)
    done = run_cli("submit", str(recipe), "--follow", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = next((runs / "steps").iterdir())
    assert (run_dir / "exit_code").read_text() == "3\n"
    assert sorted(_probes(run_dir)) == ["prep-0-0", "train-0-0", "train-0-1"]
    assert not (run_dir / "steps" / "eval").exists()
    assert (run_dir / "steps" / "prep" / f"{run_dir.name}_0_log.out").read_text().strip()
    found = json.loads(run_cli("status", run_dir.name, "--runs-dir", str(runs), "--json").stdout)
    assert found["state"] == "FAILED" and found["exit_code"] == 3
    assert found["failure"].startswith("step train exited with 3"), found["failure"]

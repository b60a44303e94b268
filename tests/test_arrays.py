"""Job arrays and sweeps (issue 14): the array spec, what validate refuses, every point checked
before anything is queued, the rendered array (one allocation, each task its own point and run
directory), and real arrays on the dev cluster and the local executor."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.errors import RecipeError, UsageError
from clusterkit.load.sweep import load_sweep, parse_grid
from clusterkit.render.sweep import render_sweep
from clusterkit.spec.arrays import array_indices
from conftest import REPO, run_cli

SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")
TRAINER = {
    "model": {
        "config": {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 128}
    },
    "dataset": {"type": "synthetic", "seq_len": 32, "num_samples": 256},
    "args": {"max_steps": 6, "logging_steps": 3, "save_steps": 6, "seed": 1},
}


def _recipe(tmp_path: Path, **fields) -> Path:
    body = {
        "name": "arr",
        "cluster": "dev",
        "runs_dir": str(tmp_path / "runs"),
        "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        "launcher": "python",
        "task": {"script": SCRIPT},
        **fields,
    }
    path = tmp_path / "arr.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _sweep(tmp_path: Path, grid: dict, max_parallel: int | None = 2, **fields) -> Path:
    fields.setdefault("launcher", "torchrun")
    fields.setdefault("task", {"trainer": TRAINER})
    fields.setdefault("parallelism", {"micro_batch_size": 4})
    return _recipe(tmp_path, sweep={"grid": grid, **({"max_parallel": max_parallel} if max_parallel else {})}, **fields)


@pytest.mark.parametrize(
    "spec, indices", [("0-3", [0, 1, 2, 3]), ("1,3,5-9:2%2", [1, 3, 5, 7, 9]), ("7", [7]), ("0-4,2-3", [0, 1, 2, 3, 4])]
)
def test_array_specs_read_as_sbatch_reads_them(spec: str, indices: list[int]) -> None:
    assert array_indices(spec) == indices


@pytest.mark.parametrize("spec", ["3-1", "0-4:0", "0-3%0", "0-20000"])
def test_array_specs_that_give_no_tasks_or_too_many_are_refused(tmp_path: Path, spec: str) -> None:
    with pytest.raises(RecipeError, match="resources.array"):
        load_recipe(_recipe(tmp_path, resources={"nodes": 1, "time": "5", "array": spec}))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"resources": {"nodes": 1, "time": "5", "array": "0-3\n"}}, "resources.array: must be a SLURM array spec"),
        (
            {"resources": {"nodes": 1, "time": "5", "array": "0-3; touch x"}},
            "resources.array: must be a SLURM array spec",
        ),
        (
            {"resources": {"nodes": 1, "time": "5", "extra_sbatch": {"array": "0-3"}}},
            "set resources.array (a script task per index)",
        ),
        (
            {
                "resources": {"nodes": 1, "time": "5", "array": "0-1"},
                "launcher": "torchrun",
                "task": {"trainer": TRAINER},
            },
            "every task would train the same run: vary it with a sweep",
        ),
        (
            {"resources": {"nodes": 1, "time": "5", "array": "0-1"}, "sweep": {"grid": {"env.X": [1, 2]}}},
            "a sweep is one job array already",
        ),
        ({"sweep": {"grid": {"env.X": []}}}, "sweep.grid: Expected `array` of length >= 1"),
        ({"sweep": {"grid": {"env X": [1]}}}, "must be a recipe key path"),
    ],
)
def test_what_an_array_or_a_sweep_cannot_be_is_refused(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **fields))
    assert message in str(raised.value)


def test_grid_flags_read_values_as_set_does() -> None:
    assert parse_grid(["task.trainer.args.learning_rate=0.001,3.0e-4", "env.MODE=a,b c"]) == {
        "task.trainer.args.learning_rate": [0.001, 0.0003],
        "env.MODE": ["a", "b c"],
    }
    for bad in ["lr", "=1,2", "a b=1", "x=", "x={a: 1}"]:
        with pytest.raises(UsageError):
            parse_grid([bad])


def test_every_point_is_a_validated_recipe_of_its_own(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"task.trainer.args.learning_rate": [0.001, 0.01], "task.trainer.args.seed": [1, 2, 3]})
    sweep = load_sweep(load_recipe(path))
    assert len(sweep.points) == 6 and sweep.spec == "0-5%2"
    values = [(p.recipe.task.trainer.args["learning_rate"], p.recipe.task.trainer.args["seed"]) for p in sweep.points]
    assert values == [(0.001, 1), (0.001, 2), (0.001, 3), (0.01, 1), (0.01, 2), (0.01, 3)]
    assert [p.recipe.array.point for p in sweep.points] == list(range(6))
    assert all(p.recipe.sweep is None for p in sweep.points)
    # --grid adds a key, or replaces one of the block's; --max-parallel replaces its throttle.
    more = load_sweep(load_recipe(path), ["task.trainer.args.seed=7", "env.TAG=x,y"], max_parallel=3)
    assert len(more.points) == 4 and more.spec == "0-3%3"
    assert {p.recipe.task.trainer.args["seed"] for p in more.points} == {7}


@pytest.mark.parametrize("command", ["validate", "sweep"])
def test_a_huge_grid_is_counted_before_it_is_built(tmp_path: Path, command: str) -> None:
    """7 keys of 10 values (a few hundred bytes) are 10,000,000 points: refused from the lengths of the
    value lists, in one line, within a memory limit that building them would exceed many times."""
    grid = {f"env.K{key}": [f"v{value}" for value in range(10)] for key in range(6)}
    path = _sweep(tmp_path, grid)
    extra = ("--grid", "env.K6=" + ",".join(f"w{value}" for value in range(10)))
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (800 << 20, 800 << 20)); "
    done = subprocess.run(
        [
            "python",
            "-c",
            limit + "from clusterkit.cli.main import main; raise SystemExit(main())",
            command,
            str(path),
            *(extra if command == "sweep" else ()),
            *(("--executor", "local") if command == "sweep" else ()),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    points = "10,000,000" if command == "sweep" else "1,000,000"
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert done.stderr == f"clusterkit: {path}: the grid has {points} points; one sweep runs at most 10,000\n"


def test_one_bad_point_stops_the_sweep_before_anything_is_written(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"parallelism.micro_batch_size": [4, 0, 2]})
    done = run_cli("sweep", str(path), "--executor", "local", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "parallelism.micro_batch_size" in lines[0]
        and "(sweep point 1: parallelism.micro_batch_size=0)" in lines[0]
    )
    assert not (tmp_path / "runs").exists()


def test_points_that_need_another_allocation_are_refused(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"resources.nodes": [1, 2]})
    with pytest.raises(
        RecipeError, match=r"sweep.grid: point 1 asks for another allocation than point 0 \(#SBATCH --nodes\)"
    ):
        render_sweep(load_sweep(load_recipe(path)))


def test_the_array_script_runs_each_tasks_own_point(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"task.trainer.args.learning_rate": [0.001, 0.01], "env.TAG": ["it's", "$(touch x)"]})
    job = render_sweep(load_sweep(load_recipe(path)))
    assert job.script_name == "sweep.sbatch" and job.script == job.files["sweep.sbatch"]
    assert sorted({name.split("/")[0] for name in job.files}) == ["0", "1", "2", "3", "sweep.json", "sweep.sbatch"]
    header = [line for line in job.script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --array=0-3%2" in header
    assert f"#SBATCH --output={tmp_path}/runs/arr/%A/%a/%A_%a_0_log.out" in header
    for index in range(4):  # each point's own script asks for exactly the driver's allocation
        point = job.files[f"{index}/job.sbatch"]
        assert [line for line in point.splitlines() if line.startswith("#SBATCH")] == header
        assert "RUN_DIR=$(cd -- " in point and '"$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID"' in point
    assert job.script.rstrip().endswith(
        f'exec bash -- {tmp_path}/runs/arr/"$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID"/job.sbatch'
    )
    assert (
        "export TAG='$(touch x)'" in job.files["3/job.sbatch"]
        and "export TAG='it'\"'\"'s'" in job.files["0/job.sbatch"]
    )
    points = json.loads(job.files["sweep.json"])["points"]
    assert points[3] == {"index": 3, "values": {"task.trainer.args.learning_rate": 0.01, "env.TAG": "$(touch x)"}}
    for name in ("sweep.sbatch", "0/job.sbatch"):
        subprocess.run(["bash", "-n"], input=job.files[name], text=True, check=True)
        subprocess.run(["shellcheck", "-S", "error", "-"], input=job.files[name], text=True, check=True)


def test_render_writes_a_sweep_into_its_folder(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"env.TAG": ["a", "b"]})
    done = run_cli("render", str(path), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote 0/, 1/, sweep.json, sweep.sbatch to" in done.stdout
    assert (tmp_path / "out" / "1" / "job.sbatch").is_file()
    again = run_cli("render", str(path), "-o", str(tmp_path / "out"), cwd=tmp_path)  # its own earlier render: replaced
    assert again.returncode == 0, again.stderr
    validated = run_cli("validate", str(path), cwd=tmp_path)
    assert validated.returncode == 0 and "ok (2 sweep points)" in validated.stdout


def _array_records(runs: Path) -> tuple[dict, list[Path]]:
    array_dir = next(p for p in (runs / "arr").iterdir() if not p.name.startswith("."))
    return json.loads((array_dir / "run.json").read_text()), sorted(p for p in array_dir.iterdir() if p.name.isdigit())


def test_a_plain_array_runs_every_index_on_the_local_executor(tmp_path: Path) -> None:
    path = _recipe(
        tmp_path,
        resources={"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5", "array": "0,2%1"},
        task={"script": SCRIPT, "args": ["{job_id}"]},
    )
    done = run_cli("submit", str(path), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    record, task_dirs = _array_records(tmp_path / "runs")
    assert record["tasks"] == [0, 2] and [p.name for p in task_dirs] == ["0", "2"]
    for task_dir in task_dirs:
        task = json.loads((task_dir / "run.json").read_text())
        assert task["job_id"] == f"{record['job_id']}_{task_dir.name}"
        env = [json.loads((task_dir / "contract" / f"rank-{r}.json").read_text())["env"] for r in range(2)]
        assert {e["SLURM_ARRAY_TASK_ID"] for e in env} == {task_dir.name}
        assert {e["RUN_DIR"] for e in env} == {str(task_dir)} and (task_dir / "exit_code").read_text().strip() == "0"
        assert (task_dir / f"{task['job_id']}_0_log.out").is_file()
    table = run_cli("status", record["job_id"], "--runs-dir", str(tmp_path / "runs"), "--csv", cwd=tmp_path)
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [(r["index"], r["state"]) for r in rows] == [("0", "COMPLETED"), ("2", "COMPLETED")]
    logs = run_cli("logs", f"{record['job_id']}_2", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert logs.returncode == 0 and "echo_contract: rank 1 of 2" in logs.stdout
    whole = run_cli("logs", record["job_id"], "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert whole.returncode == 2 and f"give one, e.g. clusterkit logs {record['job_id']}_0" in whole.stderr


def test_a_sweep_runs_on_the_local_executor(tmp_path: Path) -> None:
    path = _sweep(tmp_path, {"env.TAG": ["first", "second"]}, launcher="python", task={"script": SCRIPT})
    done = run_cli("sweep", str(path), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    record, task_dirs = _array_records(tmp_path / "runs")
    tags = [json.loads((d / "contract" / "rank-0.json").read_text())["env"]["TAG"] for d in task_dirs]
    assert tags == ["first", "second"]
    assert "env.TAG=first" in done.stdout and done.stdout.count("COMPLETED") >= 2


@pytest.mark.slurm
def test_a_four_point_sweep_is_one_throttled_array_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    """Issue 14's demonstration: 4 points as one array with at most 2 at once; four run dirs, each
    trained with its own point's values; the results table in the terminal and as CSV/JSON."""
    path = _sweep(tmp_path, {"task.trainer.args.learning_rate": [0.001, 0.003], "task.trainer.args.seed": [1, 2]})
    done = run_cli("sweep", str(path), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    record, task_dirs = _array_records(tmp_path / "runs")
    array_id = record["job_id"]
    assert [d.name for d in task_dirs] == ["0", "1", "2", "3"]
    spans = []
    for index, task_dir in enumerate(task_dirs):
        job = json.loads((task_dir / "job.json").read_text())["recipe"]
        assert job["array"] == {
            "spec": "0-3%2",
            "point": index,
            "chain": False,
            "values": {
                "task.trainer.args.learning_rate": [0.001, 0.003][index // 2],
                "task.trainer.args.seed": [1, 2][index % 2],
            },
        }
        assert job["task"]["trainer"]["args"]["learning_rate"] == [0.001, 0.003][index // 2]
        metrics = [json.loads(line) for line in (task_dir / "metrics.jsonl").read_text().splitlines()]
        spans.append((metrics[0]["time"], metrics[-1]["time"]))
        assert (task_dir / f"{array_id}_{index}_0_log.out").is_file()
        assert json.loads((task_dir / "run.json").read_text())["job_id"] == f"{array_id}_{index}"
    # The throttle held: no moment had more than two points training.
    assert max(sum(start <= moment <= end for start, end in spans) for moment, _ in spans) <= 2
    for index in range(4):
        assert f"{array_id}_{index}" in done.stdout
    assert "task.trainer.args.learning_rate=0.003 task.trainer.args.seed=2" in done.stdout
    as_json = json.loads(
        run_cli("status", array_id, "--json", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path).stdout
    )
    assert as_json["state"] == "COMPLETED" and [t["state"] for t in as_json["tasks"]] == ["COMPLETED"] * 4
    assert all(isinstance(t["final_loss"], float) and t["samples_per_s"] > 0 for t in as_json["tasks"])


# --- chains -----------------------------------------------------------------------------------------


def test_a_chain_is_an_array_run_one_link_at_a_time_in_one_run_directory(tmp_path: Path) -> None:
    path = _recipe(tmp_path, launcher="torchrun", task={"trainer": TRAINER}, parallelism={"micro_batch_size": 4})
    done = run_cli("submit", str(path), "--chain", "3", "--dry-run", "--executor", "local", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "#SBATCH --array=0-2%1" in script and "#SBATCH --no-requeue" in script  # links do not requeue themselves
    assert f"#SBATCH --output={tmp_path}/runs/arr/%A/%A_%a_0_log.out" in script
    assert "RUN_DIR=$(cd -- " in script and '/runs/arr/"$SLURM_ARRAY_JOB_ID" && pwd -P)' in script
    files = json.loads(
        run_cli("submit", str(path), "--chain", "3", "--dry-run", "--json", "--executor", "local", cwd=tmp_path).stdout
    )["files"]
    assert '"max_requeues": 0' in files["job.json"] and '"chain": true' in files["job.json"]
    sweep = run_cli(
        "submit",
        str(path),
        "--chain",
        "2",
        "--set",
        "sweep={grid: {env.X: [1, 2]}}",
        "--dry-run",
        "--executor",
        "local",
        cwd=tmp_path,
    )
    assert sweep.returncode == 2 and "--chain continues one run; this recipe is a sweep" in sweep.stderr


def test_a_chain_runs_on_the_local_executor_and_ends_at_max_steps(tmp_path: Path) -> None:
    path = _recipe(tmp_path, launcher="torchrun", task={"trainer": TRAINER}, parallelism={"micro_batch_size": 4})
    done = run_cli("submit", str(path), "--chain", "2", "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(p for p in (tmp_path / "runs" / "arr").iterdir() if not p.name.startswith("."))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["links"] == 2 and record["tasks"] == []
    starts = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [m for m in starts if m["event"] == "start"]
    # Link 0 trains to max_steps; link 1 finds the run complete and resumes at max_steps, training nothing.
    assert [m["step"] for m in starts] == [0, 6]
    assert sorted(p.name for p in run_dir.glob(f"{record['job_id']}_*_0_log.out")) == [
        f"{record['job_id']}_0_0_log.out",
        f"{record['job_id']}_1_0_log.out",
    ]
    assert (run_dir / "exit_code").read_text().strip() == "0"


@pytest.mark.slurm
def test_a_chain_of_three_continues_one_run_to_exactly_max_steps_on_the_dev_cluster(
    dev_cluster: str, tmp_path: Path
) -> None:
    """Each of the first two links is stopped by its time-limit warning — sent as SLURM sends it
    (--signal=B:USR2@grace reaches the batch shell; here scancel --signal=USR2 --batch on that link,
    as tests/test_preemption.py does) — checkpoints, and the next link continues in the same run
    directory; the last one ends at exactly max_steps."""
    # Long enough that no link can finish before its signal (the model trains ~100 steps/s here).
    trainer = {**TRAINER, "args": {**TRAINER["args"], "max_steps": 3000, "save_steps": 1000, "logging_steps": 10}}
    path = _recipe(
        tmp_path,
        launcher="torchrun",
        task={"trainer": trainer},
        parallelism={"micro_batch_size": 4},
        resources={"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 2, "time": "10"},
    )
    done = run_cli("submit", str(path), "--chain", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    run_dir = tmp_path / "runs" / "arr" / array_id
    try:
        _stop_two_links_and_finish(array_id, run_dir, tmp_path)
    finally:
        subprocess.run(["scancel", array_id], check=False)  # nothing left queued if the test fails


def _stop_two_links_and_finish(array_id: str, run_dir: Path, tmp_path: Path) -> None:
    from slurm_jobs import events, wait

    for link in (0, 1):
        wait(
            lambda link=link: (
                len(events(run_dir, "start")) > link
                and any(m["time"] > events(run_dir, "start")[-1]["time"] for m in events(run_dir, "log"))
            ),
            120,
            f"link {link} training",
        )
        # scancel may answer "already completing" (exit 229): the signal arrived and the link is ending.
        subprocess.run(["scancel", "--signal=USR2", "--batch", f"{array_id}_{link}"], check=False)
        wait(lambda link=link: len(events(run_dir, "preempted")) > link, 120, f"link {link} to checkpoint and stop")
    final = run_cli("status", array_id, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    wait(
        lambda: "COMPLETED" in run_cli("status", array_id, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path).stdout,
        240,
        "the chain to complete",
    )
    starts, stops = events(run_dir, "start"), events(run_dir, "preempted")
    assert len(starts) == 3 and starts[0]["step"] == 0
    assert [s["step"] for s in starts[1:]] == [s["step"] for s in stops] and 0 < stops[0]["step"] < stops[1][
        "step"
    ] < 3000
    assert (
        events(run_dir, "end")[-1]["step"] == 3000
        and json.loads((run_dir / "checkpoints" / "checkpoint-3000" / "trainer_state.json").read_text())["global_step"]
        == 3000
    )
    assert all((run_dir / f"{array_id}_{link}_0_log.out").is_file() for link in range(3))
    assert final.returncode == 0 and " of 3)" in final.stdout, final.stdout  # the chain's link, while one runs


# --- dependencies -----------------------------------------------------------------------------------


def test_after_and_singleton_become_sbatchs_dependency(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    earlier = tmp_path / "runs" / "arr" / "4242"
    earlier.mkdir(parents=True)
    (earlier / "run.json").write_text(
        json.dumps(
            {
                "job_id": "4242",
                "name": "arr",
                "scheduler": "slurm",
                "run_dir": str(earlier),
                "recipe": str(path),
                "submitted_at": 1.0,
                "nodes": 1,
                "ranks_per_node": 2,
                "launcher": "python",
            }
        )
    )
    done = run_cli(
        "submit",
        str(path),
        "--dry-run",
        "--executor",
        "slurm",
        "--after",
        "12,13_4",
        "--after",
        str(earlier),
        "--after-type",
        "afterany",
        "--singleton",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "sbatch --parsable --hold --dependency=afterany:12:13_4:4242,singleton " in done.stderr
    for bad, message in (
        (["--after", "12;touch x"], "not a job id"),
        (["--after", "12", "--executor", "local"], "need SLURM's queue"),
    ):
        refused = run_cli("submit", str(path), "--dry-run", *bad, cwd=tmp_path)
        assert refused.returncode == 2 and message in refused.stderr


@pytest.mark.parametrize("after", [[""], [",,,"], ["12,,13"], ["12,"], [",12"], ["12", ""]])
def test_an_empty_after_is_refused_not_dropped(tmp_path: Path, after: list[str]) -> None:
    """``--after "$JOB"`` with JOB unset (or a stray comma) would otherwise queue the job with no dependency:
    it could start before the job it was meant to wait for."""
    flags = [word for value in after for word in ("--after", value)]
    for extra in ((), ("--singleton",)):
        done = run_cli(
            "submit", str(_recipe(tmp_path)), "--dry-run", "--executor", "slurm", *flags, *extra, cwd=tmp_path
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("clusterkit: --after: an empty job id"), done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slurm
def test_a_job_submitted_after_another_starts_when_it_ended(dev_cluster: str, tmp_path: Path) -> None:
    """Two one-node jobs would run side by side on the two nodes; --after makes the second wait."""
    sleeper = str(REPO / "tests" / "scripts" / "timed_sleep.py")
    first = run_cli("submit", str(_recipe(tmp_path, task={"script": sleeper, "args": ["6"]})), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.split("submitted job ", 1)[1].split()[0]
    second = run_cli(
        "submit",
        str(_recipe(tmp_path, task={"script": sleeper, "args": ["0"]})),
        "--after",
        first_id,
        "--follow",
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    runs = tmp_path / "runs" / "arr"
    second_id = second.stdout.split("submitted job ", 1)[1].split()[0]
    ended = max(json.loads(p.read_text())["finished"] for p in (runs / first_id).glob("timed-*.json"))
    began = min(json.loads(p.read_text())["started"] for p in (runs / second_id).glob("timed-*.json"))
    assert began >= ended

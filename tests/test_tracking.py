"""Experiment tracking (tracking:) with the real trackers in their offline/file modes: a run
continued twice is ONE tracked run with a continuous step axis, read back from what each tracker
wrote. On the local executor a requeue is reproduced as `submit --resume` of the run (each start of
the job is a new process that must find the same tracked run from job.json and the record, exactly
as a requeued SLURM job does); tests/test_tracking_slurm.py has the real requeue."""

from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from clusterkit.errors import UsageError
from clusterkit.runs.record import RunRecord, TrackedRun
from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
CONTRACT = REPO / "tests" / "scripts" / "echo_contract.py"
ONE_RANK = (
    "--executor",
    "local",
    "--set",
    "resources.nodes=1",
    "--set",
    "resources.gpus_per_node=1",
    "--set",
    "task.trainer.args.logging_steps=1",
    "--set",
    "task.trainer.args.save_steps=2",
)


def _env() -> dict[str, str]:
    # No ambient tracker settings: the job's must be all it uses.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_"))}
    return {**env, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _submit(*args: str, cwd: Path) -> dict:
    assert ("--executor", "local") in zip(args, args[1:]), "never the default scheduler: a real cluster"
    done = run_cli("submit", *args, "--json", "--follow", cwd=cwd, env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"]["state"] == "COMPLETED", result
    return result["run"]


def _three_starts(tmp_path: Path, tracking: str) -> list[dict]:
    """Submitted, then resumed twice (each from the previous run directory) to 4, 8, 12 steps."""
    base = (*ONE_RANK, "--set", f"runs_dir={tmp_path / 'runs'}", "--set", f"tracking={tracking}")
    records = [_submit(str(TINY), *base, "--set", "task.trainer.args.max_steps=4", cwd=tmp_path)]
    for steps in (8, 12):
        # --executor again: a resumed run goes to the machine's default scheduler otherwise.
        records.append(
            _submit(
                "--resume",
                records[-1]["run_dir"],
                "--executor",
                "local",
                "--set",
                f"task.trainer.args.max_steps={steps}",
                cwd=tmp_path,
            )
        )
    return records


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """One chain per tracker, the three at once (each start is a fresh CPU process of the tiny GPT-2)."""
    pytest.importorskip("wandb", reason="the [tracking] extra: wandb")
    pytest.importorskip("mlflow", reason="the [tracking] extra: mlflow-skinny")
    pytest.importorskip("tensorboard", reason="the [tracking] extra: tensorboard")
    trackers = {
        "wandb": "{tracker: wandb, offline: true}",
        "mlflow": "{tracker: mlflow, offline: true}",
        "tensorboard": "tensorboard",
    }
    with ThreadPoolExecutor(len(trackers)) as pool:
        futures = {
            name: pool.submit(_three_starts, tmp_path_factory.mktemp(name), spec) for name, spec in trackers.items()
        }
        return {name: future.result() for name, future in futures.items()}


def _one_identity(records: list[dict]) -> dict:
    """Every start's record names the same tracked run, in the first run's directory."""
    identities = {json.dumps(r["tracking"], sort_keys=True) for r in records}
    assert len(identities) == 1, identities
    tracking = records[0]["tracking"]
    assert tracking["dir"] == f"{records[0]['run_dir']}/tracking"
    assert len({r["run_dir"] for r in records}) == 3, "three runs, each its own directory"
    return tracking


def test_tensorboard_one_log_dir_continuous_steps(chains: dict[str, list[dict]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracking = _one_identity(chains["tensorboard"])
    log_dir = Path(tracking["dir"]) / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 3, "one event file per start, in one log dir"
    events = EventAccumulator(str(log_dir))
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    assert steps == list(range(1, 13)), steps
    for record in chains["tensorboard"][1:]:
        assert not (Path(record["run_dir"]) / "tracking").exists(), "a resumed run writes into the first one's"


def test_mlflow_file_store_holds_one_run(chains: dict[str, list[dict]]) -> None:
    from mlflow.tracking import MlflowClient

    tracking = _one_identity(chains["mlflow"])
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = MlflowClient(f"file:{tracking['dir']}/mlruns")
    experiment = client.get_experiment_by_name("tiny-gpt2")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["clusterkit.run_id"] == tracking["run_id"] and run.info.run_name == tracking["run_id"]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(1, 13)), steps
    assert run.info.status == "FINISHED"


def _wandb_records(path: Path) -> list:
    """The protobuf records of a .wandb file (leveldb log format after wandb's 7-byte header:
    32 KiB blocks of checksum, length, type chunks); wandb 0.31 ships no Python reader of its own."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    position, pending, records = 7, b"", []
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        length, kind = struct.unpack_from("<HB", data, position + 4)
        if left < 7 or (length, kind) == (0, 0):  # the block's zero padding
            position += left
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_runs_share_one_id_and_continue_the_steps(chains: dict[str, list[dict]], tmp_path: Path) -> None:
    tracking = _one_identity(chains["wandb"])
    folders = sorted((Path(tracking["dir"]) / "wandb").glob("offline-run-*"))
    assert len(folders) == 3 and all(f.name.endswith(f"-{tracking['run_id']}") for f in folders), folders
    steps, run_ids = [], set()
    for folder in folders:
        for record in _wandb_records(folder / f"run-{tracking['run_id']}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_ids.add((record.run.run_id, record.run.project))
            elif kind == "history":
                items = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                if "train/loss" in items:
                    steps.append(items["train/global_step"])
    assert run_ids == {(tracking["run_id"], "tiny-gpt2")}
    assert steps == list(range(1, 13)), steps
    # clusterkit sync: wandb's own sync, asked what it would upload (no network here).
    last = chains["wandb"][-1]["run_dir"]
    done = run_cli("sync", last, "--dry-run", env=_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wandb sync --dry-run {folders[0]}" in done.stdout
    assert all(str(folder / f"run-{tracking['run_id']}.wandb") in done.stderr for folder in folders), done.stderr


def test_sync_says_what_it_cannot_do(chains: dict[str, list[dict]], tmp_path: Path) -> None:
    mlflow_run = chains["mlflow"][0]["run_dir"]
    done = run_cli("sync", mlflow_run, cwd=tmp_path, env=_env())
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert (
        "mlflow has no command that uploads a file-store run" in done.stderr
        and "mlflow ui --backend-store-uri" in done.stderr
    )
    done = run_cli("sync", chains["tensorboard"][2]["run_dir"], cwd=tmp_path, env=_env())
    assert done.returncode == 2 and "tensorboard --logdir" in done.stderr and done.stderr.count("\n") == 1


def _script_recipe(tmp_path: Path, tracking: object) -> Path:
    path = tmp_path / "my script ~%-.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "scripted",
                "cluster": "dev",
                "runs_dir": str(tmp_path / "runs dir -x"),
                "launcher": "torchrun",
                "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
                "task": {"script": str(CONTRACT)},
                "tracking": tracking,
            }
        )
    )
    return path


def test_a_script_task_gets_the_tracked_run_in_its_environment(tmp_path: Path) -> None:
    """The user's own script reports itself: it finds the same identity in its environment, and
    for mlflow clusterkit's helper finds (or on the first start creates) the one run."""
    pytest.importorskip("mlflow", reason="the [tracking] extra: mlflow-skinny")
    record = _submit(
        str(_script_recipe(tmp_path, {"tracker": "mlflow", "offline": True, "project": "my exp"})),
        "--executor",
        "local",
        cwd=tmp_path,
    )
    env = json.loads((Path(record["run_dir"]) / "contract" / "rank-0.json").read_text())["env"]
    tracking = record["tracking"]
    assert env["CLUSTERKIT_TRACKING_RUN_ID"] == tracking["run_id"] and env["CLUSTERKIT_TRACKING"] == "mlflow"
    assert env["MLFLOW_TRACKING_URI"] == f"file:{record['run_dir']}/tracking/mlruns"
    assert env["MLFLOW_EXPERIMENT_NAME"] == "my exp" and "MLFLOW_RUN_ID" not in env
    from clusterkit.runtime.tracking import mlflow_run_id

    names = ("CLUSTERKIT_TRACKING_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: env[name] for name in names})
    try:
        assert mlflow_run_id() == mlflow_run_id(), "the second start finds the run the first created"
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    runs = list((Path(record["run_dir"]) / "tracking" / "mlruns").glob("*/*/meta.yaml"))
    assert len(runs) == 1, runs


def test_unknown_tracker_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_cli("validate", str(TINY), "--set", "tracking=wandbb", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "tracking" in done.stderr, done.stderr
    done = run_cli(
        "validate", str(TINY), "--set", "tracking={tracker: mlflow, offline: yes, colour: red}", cwd=tmp_path
    )
    assert done.returncode == 2 and "colour" in done.stderr, done.stderr
    done = run_cli("validate", str(TINY), "--set", 'tracking={tracker: wandb, run_id: "x\\ny"}', cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_sync_of_an_untracked_or_online_run_is_one_clear_line(tmp_path: Path) -> None:
    record = _submit(str(_script_recipe(tmp_path, "none")), "--executor", "local", cwd=tmp_path)
    assert record["tracking"] is None
    done = run_cli("sync", record["run_dir"], cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not tracked" in done.stderr, done.stderr
    online = _submit(
        str(_script_recipe(tmp_path, {"tracker": "wandb", "project": "p"})), "--executor", "local", cwd=tmp_path
    )
    done = run_cli("sync", online["run_dir"], cwd=tmp_path)
    assert done.returncode == 2 and "tracked online" in done.stderr, done.stderr


def test_a_sweep_with_tracking_is_refused(tmp_path: Path) -> None:
    done = run_cli(
        "sweep",
        str(TINY),
        "--executor",
        "local",
        "--set",
        "tracking=tensorboard",
        "--grid",
        "task.trainer.args.learning_rate=0.1,0.01",
        "--set",
        f"runs_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "sweep or job array" in done.stderr, done.stderr
    assert not list(tmp_path.glob("tiny-gpt2*")), "nothing submitted"


def _earlier(tmp_path: Path) -> RunRecord:
    run_dir = tmp_path / "runs dir -x %" / "tiny-gpt2" / "7"
    run_dir.mkdir(parents=True)
    record = RunRecord(
        job_id="7",
        name="tiny-gpt2",
        scheduler="local",
        run_dir=str(run_dir),
        recipe=str(TINY),
        submitted_at=1.0,
        nodes=1,
        ranks_per_node=1,
        launcher="torchrun",
        tracking=TrackedRun("wandb", "abc-1", f"{run_dir}/tracking", offline=True),
    )
    record.write()
    return record


def test_the_identity_is_fresh_per_submit_and_kept_by_resume(tmp_path: Path) -> None:
    from clusterkit.launch.prepare import SubmitOptions, prepare, tracked
    from clusterkit.load.loader import load_recipe

    loaded = load_recipe(TINY, ["tracking={tracker: wandb, offline: true}"])
    first, second = (tracked(loaded, None, sweep=False).recipe.tracking for _ in range(2))
    assert first.run_id != second.run_id and first.dir is None
    earlier = _earlier(tmp_path)
    resumed = tracked(loaded, earlier, sweep=False).recipe.tracking
    assert (resumed.run_id, resumed.dir) == ("abc-1", earlier.tracking.dir)
    other = tracked(load_recipe(TINY, ["tracking=tensorboard"]), earlier, sweep=False).recipe.tracking
    assert other.run_id != "abc-1" and other.dir is None, "another tracker: a new tracked run"
    request = prepare(
        SubmitOptions(
            resume=earlier.run_dir,
            from_scratch=True,
            executor="local",
            overrides=("tracking={tracker: wandb, offline: true}",),
        )
    ).request
    assert request.tracking.run_id != "abc-1", "--from-scratch starts at step 0 again: a new tracked run"
    script = request.files["job.sbatch"]
    assert f"export WANDB_RUN_ID={request.tracking.run_id}\n" in script and "export WANDB_MODE=offline\n" in script
    assert f'"run_id": "{request.tracking.run_id}"' in request.files["job.json"], (
        "job.json, which the runner reads, names the same run"
    )


def test_sync_runs_wandb_with_each_folder_as_one_argument(tmp_path: Path) -> None:
    from clusterkit.runs.tracking_sync import sync_argv

    earlier = _earlier(tmp_path)
    with pytest.raises(UsageError, match="no offline wandb run abc-1"):
        sync_argv(earlier)
    offline = Path(earlier.tracking.dir) / "wandb"
    for name in (
        "offline-run-20260101_000002-abc-1",
        "offline-run-20260101_000001-abc-1",
        "offline-run-20260101_000003-other",
    ):
        (offline / name).mkdir(parents=True)
    (offline / "latest-run").symlink_to(offline / "offline-run-20260101_000002-abc-1")
    argv = sync_argv(earlier, dry_run=True)
    assert argv == [
        "wandb",
        "sync",
        "--dry-run",
        str(offline / "offline-run-20260101_000001-abc-1"),
        str(offline / "offline-run-20260101_000002-abc-1"),
    ]

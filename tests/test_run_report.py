"""``clusterkit report`` and ``clusterkit diff`` on run directories built as real runs leave them
(run.json, job.json from the real loader, metrics.jsonl lines as the runner writes them) with sacct's
rows from a stand-in ``sacct`` on PATH: a run preempted once and requeued, a retried run, a run of
the local executor, a sweep, and damaged input (cut lines, a FIFO, a huge file, missing files),
which gives "n/a" with the reason, never a traceback."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import sys
from pathlib import Path

import msgspec
import pytest

from clusterkit import load_recipe
from clusterkit.cli.parser import run as run_cli_here
from clusterkit.diagnose.run_facts import gather
from clusterkit.diagnose.run_report import RunFacts, run_report
from clusterkit.runs.record import RunRecord
from clusterkit.schedulers.slurm_accounting import NoAccounting, read_sacct
from clusterkit.spec.resolved import JobFile
from conftest import RECIPES
from test_json_shapes import DOCS, differences

TINY = RECIPES / "tiny-gpt2-cpu.yaml"
DAY = dt.datetime(2026, 11, 27)


def at(clock: str) -> float:
    """An epoch time from a local ``HH:MM:SS`` of the test day (sacct's times are local, zone-less)."""
    return dt.datetime.combine(DAY, dt.time.fromisoformat(clock)).timestamp()


def sacct_line(job_id: str, state: str, submit: str, start: str, end: str, gpus: int = 4, cpus: int = 8) -> str:
    """A line as ``sacct --parsable2`` prints it in FIELDS' order (an array task's raw id is a number of its own)."""
    raw = job_id if job_id.isdigit() else str(1000 + int(job_id.rpartition("_")[2]))
    elapsed = int(at(end) - at(start))
    day = DAY.date().isoformat()
    tres = f"billing={cpus},cpu={cpus},gres/gpu={gpus},mem=4G,node=2"
    return f"{raw}|{job_id}|{state}|0:0|{day}T{submit}|{day}T{start}|{day}T{end}|{elapsed}|node[1-2]|{tres}|debug"


# Job 41 preempted at 00:01:05 and requeued by the supervisor; its second instance completed.
PREEMPTED_ONCE = [
    sacct_line("41", "PREEMPTED", "00:00:00", "00:00:05", "00:01:05"),
    sacct_line("41", "COMPLETED", "00:01:06", "00:01:36", "00:03:36"),
]
# What the runner wrote in those two instances: a start, log lines, the preemption's checkpoint at
# step 20, and after the requeue a start at step 20 (resumed from it), more steps, a save and the end.
PREEMPTED_METRICS = [
    {"event": "start", "time": at("00:00:15"), "step": 0, "max_steps": 60, "world_size": 4, "global_batch_size": 16},
    {"event": "log", "time": at("00:00:35"), "step": 10, "loss": 5.0, "samples_per_s": 8.0, "tokens_per_s": 512.0},
    {"event": "log", "time": at("00:00:55"), "step": 20, "loss": 4.0, "samples_per_s": 8.0, "tokens_per_s": 512.0},
    {"event": "checkpoint", "time": at("00:00:58"), "step": 20, "save_s": 3.0},
    {"event": "preempted", "time": at("00:00:58"), "step": 20},
    {"event": "start", "time": at("00:01:46"), "step": 20, "max_steps": 60, "world_size": 4},
    {"event": "log", "time": at("00:02:06"), "step": 30, "loss": 3.5, "samples_per_s": 7.0, "tokens_per_s": 448.0},
    {"event": "log", "time": at("00:02:26"), "step": 40, "loss": 3.0, "samples_per_s": 8.0, "tokens_per_s": 512.0},
    {"event": "log", "time": at("00:03:06"), "step": 60, "loss": 2.5, "samples_per_s": 8.0, "tokens_per_s": 512.0},
    {"event": "checkpoint", "time": at("00:03:10"), "step": 60, "save_s": 4.0},
    {"event": "end", "time": at("00:03:12"), "step": 60, "world_size": 4},
]


def job_json(*overrides: str) -> bytes:
    loaded = load_recipe(TINY, overrides)
    return msgspec.json.encode(JobFile(recipe=loaded.recipe, profile=loaded.profile))


def make_run(
    runs: Path,
    job_id: str,
    scheduler: str = "slurm",
    metrics: list[dict] | None = None,
    overrides: tuple[str, ...] = ("cluster=infiniband-h100",),
    **fields,
) -> RunRecord:
    run_dir = runs / "tiny-gpt2" / job_id
    run_dir.mkdir(parents=True)
    record = RunRecord(
        job_id, "tiny-gpt2", scheduler, str(run_dir), str(TINY), at("00:00:00"), 2, 2, "torchrun", **fields
    )
    record.write()
    (run_dir / "job.json").write_bytes(job_json(*overrides))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in metrics))
    return record


class Sacct:
    """A stand-in Host whose sacct answers these lines (or fails as a cluster without accounting)."""

    name = "fake"

    def __init__(self, lines: list[str], returncode: int = 0, stderr: str = ""):
        self.lines, self.returncode, self.stderr, self.asked = lines, returncode, stderr, []

    def run(self, argv, timeout=30.0):
        from clusterkit.schedulers.host import Completed

        self.asked.append(list(argv))
        return Completed(self.returncode, "\n".join(self.lines) + "\n", self.stderr)


def run_file(record: RunRecord, name: str) -> Path:
    return record.path / name


def share(report, bucket: str) -> float:
    return next(s.seconds for s in report.shares if s.bucket == bucket)


def test_preempted_once_and_resumed_time_lost_and_gpu_hours_from_sacct(tmp_path: Path) -> None:
    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS)
    host = Sacct(PREEMPTED_ONCE)
    report = run_report(gather(record, run_file, host))
    assert "--jobs=41" in host.asked[0] and "--duplicates" in host.asked[0]
    assert report.source == "sacct" and report.note is None
    assert report.gpu_hours.value == pytest.approx(4 * (60 + 120) / 3600) and report.gpu_hours.source == "sacct"
    assert report.cpu_hours.value == pytest.approx(8 * 180 / 3600)
    assert report.queue_wait.value == 5 and report.wall.value == at("00:03:36") - at("00:00:05")
    # The first instance: 10 s start-up, 40 s of training and the 3 s preemption save, then 7 s
    # until it ended; the requeued one: 10 s to its first step (its restart), 82 s of training,
    # a 4 s save and 24 s of shutdown.
    assert share(report, "startup") == 10
    assert share(report, "requeues") == 7 + 10
    assert share(report, "training") == 40 + 82
    assert share(report, "checkpointing") == 3 + 4
    assert share(report, "other") == 24
    assert sum(s.seconds for s in report.shares) == 180, "every allocated second is in one bucket"
    assert sum(s.gpu_hours for s in report.shares) == pytest.approx(report.gpu_hours.value)
    assert report.samples_per_s.value == 8.0 and report.tokens_per_s.value == 512.0


def test_steps_redone_after_an_older_checkpoint_are_lost(tmp_path: Path) -> None:
    """Preempted without a save of its own: the requeued job resumes at step 10 and redoes 10-20."""
    metrics = [line for line in PREEMPTED_METRICS if line["event"] != "checkpoint" or line["step"] != 20]
    metrics[4] = {**metrics[4], "step": 10}  # the second start
    assert metrics[4]["event"] == "start"
    report = run_report(gather(make_run(tmp_path, "41", metrics=metrics), run_file, Sacct(PREEMPTED_ONCE)))
    # kept until step 10's log (00:00:35): 20 s; 00:00:35 -> 00:01:05 lost, + 10 s restart
    assert share(report, "training") == 20 + (86 - 4)
    assert share(report, "requeues") == 30 + 10


def test_without_metrics_the_requeued_instance_is_all_lost(tmp_path: Path) -> None:
    """A task.script run (no metrics.jsonl): the first instance's whole elapsed time went to the requeue."""
    report = run_report(gather(make_run(tmp_path, "41"), run_file, Sacct(PREEMPTED_ONCE)))
    assert share(report, "requeues") == 60 and share(report, "other") == 120
    assert report.gpu_hours.value == pytest.approx(4 * 180 / 3600)
    assert "no metrics.jsonl in the run directory" in report.note
    assert report.samples_per_s.value is None and "no samples/s" in report.samples_per_s.why


def test_a_retry_is_a_job_of_its_own_and_its_time_lost_is_the_retrys(tmp_path: Path) -> None:
    record = make_run(tmp_path, "50", metrics=PREEMPTED_METRICS[:3] + PREEMPTED_METRICS[5:])
    (record.path / "retries.jsonl").write_text(json.dumps({"retry": 1, "job_id": "52", "after_job": "50"}) + "\n")
    host = Sacct(
        [
            sacct_line("50", "NODE_FAIL", "00:00:00", "00:00:05", "00:01:05"),
            sacct_line("52", "COMPLETED", "00:01:06", "00:01:36", "00:03:36"),
        ]
    )
    report = run_report(gather(record, run_file, host))
    assert "--jobs=50,52" in host.asked[0]
    assert [job.job_id for job in report.jobs] == ["50", "52"]
    assert share(report, "retries") == (at("00:01:05") - at("00:00:55")) + 10 and share(report, "requeues") == 0


def test_a_hang_is_taken_out_of_the_loss_it_caused(tmp_path: Path) -> None:
    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS[:3])
    (record.path / "hang.json").write_text(json.dumps({"time": at("00:01:00"), "why": "no progress for 5 s"}))
    host = Sacct([sacct_line("41", "FAILED", "00:00:00", "00:00:05", "00:01:05")])
    report = run_report(gather(record, run_file, host))
    assert share(report, "hangs") == 5 and share(report, "other") == 5


def test_mfu_from_the_planners_size_and_the_profiles_peak(tmp_path: Path) -> None:
    from clusterkit.estimate.modelsize import model_shape

    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS)
    report = run_report(gather(record, run_file, Sacct(PREEMPTED_ONCE)))
    config = load_recipe(TINY).recipe.task.trainer.model.config
    params = model_shape(config, 64).params
    assert report.mfu.value == pytest.approx(100 * 6 * params * 512.0 / (4 * 989e12))
    assert "peak_tflops" in report.mfu.source


def test_the_local_executor_estimates_from_its_own_files(tmp_path: Path) -> None:
    record = make_run(tmp_path, "7", scheduler="local", metrics=PREEMPTED_METRICS[:3], overrides=())
    report = run_report(gather(record, run_file, None))
    assert report.source == "run files" and "estimates" in report.note and "local executor" in report.note
    assert report.queue_wait.value is None and report.queue_wait.why == "local executor: no queue"
    assert report.wall.value == at("00:00:55") - at("00:00:00") and report.wall.source.startswith("estimate")
    assert report.gpu_hours.value == 0, "a CPU profile allocates no GPUs"
    assert report.cpu_hours.value == pytest.approx(2 * 1 * 2 * 55 / 3600)  # nodes x tasks x cpus_per_task
    assert report.mfu.value is None and report.mfu.why == "a CPU run: no GPU peak"
    assert share(report, "startup") == 15 and share(report, "training") == 40


def test_no_accounting_is_said_in_one_line_and_figures_are_estimates(tmp_path: Path) -> None:
    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS)
    host = Sacct([], 1, "sacct: error: Slurm accounting storage is disabled\n")
    report = run_report(gather(record, run_file, host))
    assert isinstance(gather(record, run_file, host).accounting, NoAccounting)
    assert report.note.startswith("no SLURM accounting here (sacct: error: Slurm accounting storage is disabled)")
    assert "\n" not in report.note and report.gpu_hours.source.startswith("estimate")
    assert report.gpu_hours.value == pytest.approx(4 * (at("00:03:12") - at("00:00:00")) / 3600)


@pytest.mark.parametrize(
    "damage",
    ["cut", "garbage", "fifo", "huge", "missing", "directory", "no-job-json", "bad-job-json", "nul", "not-finite"],
)
def test_damaged_or_missing_files_give_n_a_with_the_reason(tmp_path: Path, damage: str) -> None:
    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS)
    metrics = record.path / "metrics.jsonl"
    if damage == "cut":  # a rank killed mid-write: the last line cut short
        metrics.write_bytes(metrics.read_bytes()[:-25])
    elif damage == "garbage":
        metrics.write_text('[1,2]\n"text"\n{"event": "log", "time": "soon", "step": "x"}\nnot json\n')
    elif damage == "fifo":
        metrics.unlink()
        os.mkfifo(metrics)
    elif damage == "huge":
        with metrics.open("r+b") as out:
            out.truncate(300 << 20)  # sparse: larger than any metrics file is read
    elif damage == "missing":
        metrics.unlink()
    elif damage == "directory":
        metrics.unlink()
        metrics.mkdir()
    elif damage == "no-job-json":
        (record.path / "job.json").unlink()
    elif damage == "bad-job-json":
        (record.path / "job.json").write_text('{"recipe": 1}')
    elif damage == "not-finite":  # Python's json reads these; no time or rate is one
        with metrics.open("a") as out:
            out.write('{"event": "log", "time": Infinity, "step": 61, "samples_per_s": NaN, "tokens_per_s": NaN}\n')
            out.write('{"event": "checkpoint", "time": NaN, "step": 61, "save_s": Infinity}\n')
    elif damage == "nul":
        metrics.write_bytes(b"\0" * 100 + b"\n\xff\xfe\n")
    report = run_report(gather(record, run_file, Sacct(PREEMPTED_ONCE)))
    assert report.gpu_hours.value == pytest.approx(0.2), "sacct's figures do not need the run's files"
    if damage in ("cut", "not-finite"):
        assert share(report, "training") > 0 and sum(s.seconds for s in report.shares) == 180
        assert report.samples_per_s.value == 8.0
        return
    if damage in ("no-job-json", "bad-job-json"):
        assert report.mfu.value is None and "job.json" in report.mfu.why
        assert "job.json" in report.problems["job.json"]
        return
    assert report.samples_per_s.value is None and report.samples_per_s.why
    why = report.problems.get("metrics.jsonl", "")
    expected = {
        "fifo": "not a regular file",
        "huge": "larger than 256 MiB",
        "missing": "no metrics.jsonl",
        "directory": "metrics.jsonl",
    }.get(damage)
    if expected:
        assert expected in why and expected in report.note
    assert share(report, "requeues") == 60  # without events: what sacct alone says


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = run_cli_here(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fake_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A ``sacct`` on PATH answering from the lines of tmp_path/sacct.txt, those of the --jobs asked
    (SLURM's own tools are not run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "jobs = next(a for a in sys.argv if a.startswith('--jobs=')).split('=', 1)[1].split(',')\n"
        f"for line in open({str(tmp_path / 'sacct.txt')!r}):\n"
        "    if line.split('|')[1] in jobs:\n"
        "        print(line, end='')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "sacct.txt"


def test_the_cli_report_text_json_and_csv(tmp_path: Path, capsys, fake_sacct: Path) -> None:
    fake_sacct.write_text("\n".join(PREEMPTED_ONCE) + "\n")
    runs = tmp_path / "runs"
    make_run(runs, "41", metrics=PREEMPTED_METRICS)
    code, out, err = cli(capsys, "report", "41", "--runs-dir", str(runs))
    assert code == 0, err
    assert "lost to requeues" in out and "0.20 GPU-h" in out and "[sacct]" in out
    code, out, _ = cli(capsys, "report", str(runs / "tiny-gpt2" / "41"), "--json")
    shape = json.loads(out)
    assert differences(shape, DOCS["clusterkit report --json RUN"][0]) == []
    assert shape["figures"]["gpu_hours"] == {
        "value": pytest.approx(0.2),
        "unit": "GPU-h",
        "source": "sacct",
        "why": None,
    }
    assert {s["bucket"]: s["seconds"] for s in shape["shares"]}["requeues"] == 17
    assert [job["state"] for job in shape["jobs"]] == ["PREEMPTED", "COMPLETED"]
    code, out, _ = cli(capsys, "report", "41", "--runs-dir", str(runs), "--csv")
    header, row = out.splitlines()
    assert header.startswith("job_id,queue_wait,wall,gpu_hours") and row.startswith("41,5.0,")
    code, _, err = cli(capsys, "report", "41", "--runs-dir", str(runs), "--csv", "--json")
    assert code == 2 and err.count("\n") == 1
    # Not found under runs_dir nor in the run index (where the suite's own dev-cluster jobs are: 999 was one).
    code, _, err = cli(capsys, "report", "987654321012", "--runs-dir", str(runs))
    assert code == 2 and "no run with job id 987654321012" in err and err.count("\n") == 1


def test_a_sweep_has_a_row_per_point_and_totals(tmp_path: Path, capsys, fake_sacct: Path) -> None:
    fake_sacct.write_text(
        "\n".join(
            [
                sacct_line("60_0", "COMPLETED", "00:00:00", "00:00:05", "00:01:05"),
                sacct_line("60_1", "COMPLETED", "00:00:00", "00:00:10", "00:02:10"),
            ]
        )
        + "\n"
    )
    runs = tmp_path / "runs"
    array = make_run(runs, "60", tasks=(0, 1))
    (array.path / "sweep.json").write_text(
        json.dumps({"points": [{"index": i, "values": {"lr": lr}} for i, lr in ((0, 0.1), (1, 0.2))]})
    )
    for index in (0, 1):
        task = array.path / str(index)
        task.mkdir()
        (task / "job.json").write_bytes(job_json("cluster=infiniband-h100"))
        (task / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in PREEMPTED_METRICS[:3]))
    code, out, err = cli(capsys, "report", "60", "--runs-dir", str(runs), "--json")
    assert code == 0, err
    shape = json.loads(out)
    assert differences(shape, DOCS["clusterkit report --json SWEEP"][0]) == []
    assert [p["point"] for p in shape["points"]] == [{"lr": 0.1}, {"lr": 0.2}]
    assert [p["job_id"] for p in shape["points"]] == ["60_0", "60_1"]
    assert shape["totals"]["gpu_hours"]["value"] == pytest.approx(4 * (60 + 120) / 3600)
    code, out, _ = cli(capsys, "report", "60", "--runs-dir", str(runs), "--csv")
    assert out.splitlines()[0].startswith("index,job_id,lr,") and len(out.splitlines()) == 3
    code, out, _ = cli(capsys, "report", "60", "--runs-dir", str(runs))
    assert "lr=0.1" in out and "total: 0.20 GPU-h" in out


def test_sacct_rows_outside_the_run_and_garbage_are_harmless(tmp_path: Path) -> None:
    rows = read_sacct("\n".join(PREEMPTED_ONCE))
    facts = RunFacts(record=make_run(tmp_path, "41"), accounting=rows[:1] + [rows[0]])
    report = run_report(facts)
    assert report.gpu_hours.value == pytest.approx(2 * 4 * 60 / 3600)
    assert run_report(RunFacts(record=facts.record, accounting=[])).gpu_hours.value is None


def test_scaling_efficiency_from_the_bench_table_beside_the_run(tmp_path: Path) -> None:
    record = make_run(tmp_path, "41", metrics=PREEMPTED_METRICS)
    older, newer = record.path.parent / "bench-20261101-000000", record.path.parent / "bench-20261126-000000"
    for folder, efficiency in ((older, 50.0), (newer, 90.0)):
        folder.mkdir()
        scales = [{"gpus": 2, "samples_per_s": 5.0}, {"gpus": 4, "samples_per_s": 10.0, "efficiency_pct": efficiency}]
        (folder / "bench.json").write_text(json.dumps({"name": "tiny-gpt2", "scales": scales}))
    (record.path.parent / "bench-20261127-000000").mkdir()  # a bench that wrote nothing
    (record.path.parent / "bench-20261127-000000" / "bench.json").write_text("{cut")
    report = run_report(gather(record, run_file, Sacct(PREEMPTED_ONCE)))
    assert report.scaling_efficiency.value == 90.0 and report.scaling_efficiency.source.startswith(str(newer))
    assert report.vs_bench.value == pytest.approx(80.0), "8 samples/s where the bench measured 10"
    lone = make_run(tmp_path / "other", "42", metrics=PREEMPTED_METRICS)
    report = run_report(gather(lone, run_file, Sacct(PREEMPTED_ONCE)))
    assert (
        report.scaling_efficiency.value is None
        and "no clusterkit bench table with 4 GPUs" in report.scaling_efficiency.why
    )


# Real lines of the dev cluster's sacct (slurmdbd), as `sacct --parsable2 --allocations --duplicates`
# printed them: a job with stand-in GPUs (gres/gpu=2) and a job array's task.
REAL_SACCT = [
    "4|4|COMPLETED|0:0|2026-11-27T04:17:47|2026-11-27T04:18:37|2026-11-27T04:18:38|1|node[1-2]|billing=2,cpu=2,gres/gpu=2,node=2|debug",
    "8|8|COMPLETED|0:0|2026-11-27T04:18:38|2026-11-27T04:18:40|2026-11-27T04:19:13|33|node[1-2]|billing=4,cpu=4,node=2|debug",
    "7|5_0|COMPLETED|0:0|2026-11-27T04:17:47|2026-11-27T04:18:14|2026-11-27T04:18:14|0|node3|billing=1,cpu=1,node=1|debug",
]


@pytest.mark.parametrize(
    ("job_id", "gpu_hours", "cpu_hours", "queue_wait"),
    [("4", 2 / 3600, 2 / 3600, 50), ("8", 0, 4 * 33 / 3600, 2), ("5_0", 0, 0, 27)],
)
def test_real_sacct_lines(tmp_path: Path, job_id: str, gpu_hours: float, cpu_hours: float, queue_wait: float) -> None:
    record = make_run(tmp_path, job_id, overrides=())
    report = run_report(gather(record, run_file, Sacct(REAL_SACCT)))
    assert report.source == "sacct" and [job.job_id for job in report.jobs] == [job_id]
    assert report.gpu_hours.value == pytest.approx(gpu_hours) and report.cpu_hours.value == pytest.approx(cpu_hours)
    assert report.queue_wait.value == queue_wait


def test_a_chains_links_are_start_ups_not_losses(tmp_path: Path) -> None:
    """A chain (submit --chain 2): one run directory, its links tasks of one array run one after
    another; sacct, asked for the array, answers with each link."""
    record = make_run(tmp_path, "70", metrics=PREEMPTED_METRICS, links=2)
    host = Sacct(
        [
            sacct_line("70_0", "COMPLETED", "00:00:00", "00:00:05", "00:01:05"),
            sacct_line("70_1", "COMPLETED", "00:00:00", "00:01:36", "00:03:36"),
            sacct_line("71", "COMPLETED", "00:00:00", "00:00:05", "00:01:05"),  # another job: not this run's
        ]
    )
    report = run_report(gather(record, run_file, host))
    assert [job.job_id for job in report.jobs] == ["70_0", "70_1"]
    assert share(report, "requeues") == share(report, "retries") == 0
    assert share(report, "startup") == 10 + 10 and share(report, "other") == 7 + 24

"""`clusterkit plot`: the chart's values are the metrics' values. One real two-point sweep of the tiny
GPT-2 on the local executor (one node, one rank per point, a log line every step) feeds every test:
the PNG is a PNG of the expected size, each Line2D of the figure and each --json series holds
exactly what the runner wrote to metrics.jsonl, a sweep id expands to its points, several runs share
one chart, the text chart appears without a display, a run without metrics is one line and exit 1,
values that are no numbers are skipped, and without matplotlib or plotext it says what to install."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterkit.runs.charts import figure
from clusterkit.runs.curves import QUANTITIES, curves_of
from clusterkit.runs.record import metric_records
from conftest import REPO, run_cli

pytest.importorskip("matplotlib", reason="clusterkit plot's PNG: the [bench] extra")
pytest.importorskip("plotext", reason="clusterkit plot's terminal chart: the [bench] extra")

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
RATES = (0.001, 0.0003)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Sweep:
    array_id: str
    array_dir: Path
    runs_dir: Path


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    runs = tmp_path_factory.mktemp("plot") / "runs"
    done = run_cli(
        "sweep",
        str(TINY),
        "--grid",
        f"task.trainer.args.learning_rate={RATES[0]},{RATES[1]}",
        "--executor",
        "local",
        "--follow",
        "--json",
        "--max-parallel",
        "2",
        "--set",
        f"runs_dir={runs}",
        "--set",
        "resources.nodes=1",
        "--set",
        "resources.gpus_per_node=1",
        "--set",
        "task.trainer.args.max_steps=4",
        "--set",
        "task.trainer.args.logging_steps=1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(done.stdout)["run"]
    return Sweep(run["job_id"], Path(run["run_dir"]), runs)


def no_display() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}


def plot(sweep: Sweep, *args: str, env: dict[str, str] | None = None):
    return run_cli("plot", *args, "--runs-dir", str(sweep.runs_dir), env=env or no_display())


def logged(run_dir: Path, quantity: str) -> tuple[list[int], list[float]]:
    """What the runner wrote: the quantity at each logged step, straight from metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if row["event"] == "log"]
    return [row["step"] for row in rows], [row[quantity] for row in rows]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_a_sweep_id_is_every_point_in_one_png_and_its_json_is_the_metrics(sweep: Sweep) -> None:
    done = plot(sweep, sweep.array_id, "--json")
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)
    png = sweep.array_dir / "curves.png"
    assert output["outputs"] == [str(png)]
    assert png_size(png) == (900, 840) and png.stat().st_size > 20_000  # 9 x 8.4 in at 100 dpi: three panels
    assert [run["job_id"] for run in output["runs"]] == [f"{sweep.array_id}_0", f"{sweep.array_id}_1"]
    for index, (run, rate) in enumerate(zip(output["runs"], RATES)):
        run_dir = sweep.array_dir / str(index)
        assert run["run_dir"] == str(run_dir)
        assert run["point"] == {"task.trainer.args.learning_rate": rate}
        assert run["label"] == f"{sweep.array_id}_{index} learning_rate={rate}"
        assert set(run["series"]) == set(QUANTITIES)
        for quantity, series in run["series"].items():
            steps, values = logged(run_dir, quantity)
            assert steps == [1, 2, 3, 4]  # every step the tiny run logged, none invented
            assert (series["steps"], series["values"]) == (steps, values), quantity


def test_the_figure_lines_are_the_values_in_metrics_jsonl(sweep: Sweep) -> None:
    runs = [
        curves_of(
            f"{sweep.array_id}_{i}",
            str(sweep.array_dir / str(i)),
            metric_records((sweep.array_dir / str(i) / "metrics.jsonl").read_text()),
        )
        for i in (0, 1)
    ]
    chart = figure(runs)
    assert [axes.get_title() for axes in chart.axes] == list(QUANTITIES.values())
    for axes, quantity in zip(chart.axes, QUANTITIES):
        lines = axes.get_lines()
        assert [line.get_label() for line in lines] == [run.label for run in runs]
        for index, line in enumerate(lines):
            steps, values = logged(sweep.array_dir / str(index), quantity)
            assert (list(line.get_xdata()), list(line.get_ydata())) == (steps, values), (quantity, index)


def test_several_runs_on_one_chart_drawn_in_the_terminal_without_a_display(sweep: Sweep) -> None:
    tasks = [f"{sweep.array_id}_0", f"{sweep.array_id}_1"]
    done = plot(sweep, *tasks)
    assert done.returncode == 0, done.stderr
    png = sweep.array_dir / f"curves-{tasks[0]}-{tasks[1]}.png"  # beside the first run
    assert png_size(png) == (900, 840)
    lines = done.stdout.splitlines()
    assert lines[0] == f"wrote {png}  (2 runs: {tasks[0]}; {tasks[1]})"  # a task given alone: no point in its label
    chart = "\n".join(lines[1:])
    assert "\x1b[" not in chart  # no colour codes into a pipe
    for title in QUANTITIES.values():
        assert re.search(rf"^ +{re.escape(title)}$", chart, re.M), title
    assert chart.count("┌") == 3 and chart.count("└") == 3  # three framed panels
    assert chart.count(tasks[0]) == 3 and chart.count(tasks[1]) == 3  # each run in each panel's legend
    assert len(re.findall(r"^ +1 +2 +3 +4$", chart, re.M)) == 3  # the step axis, 1 to 4

    with_display = plot(sweep, tasks[0], env={**no_display(), "DISPLAY": ":0"})
    assert with_display.returncode == 0 and with_display.stdout.splitlines() == [
        f"wrote {sweep.array_dir / '0' / 'curves.png'}  (1 run: {tasks[0]})"
    ]  # the PNG alone
    forced = plot(sweep, tasks[0], "--terminal", "-o", str(png), env={**no_display(), "DISPLAY": ":0"})
    assert forced.returncode == 0 and "┌" in forced.stdout


def _copy(sweep: Sweep, tmp_path: Path, index: int = 0) -> Path:
    """A task's run directory copied under a hostile path (its record names the copy)."""
    copy = tmp_path / "a b%~-x" / "-run 1"
    shutil.copytree(sweep.array_dir / str(index), copy, ignore=shutil.ignore_patterns("curves*.png"))
    record = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**record, "run_dir": str(copy)}))
    return copy


def test_a_run_without_metrics_is_one_line_and_exit_1(sweep: Sweep, tmp_path: Path) -> None:
    copy = _copy(sweep, tmp_path)
    (copy / "metrics.jsonl").unlink()
    done = plot(sweep, str(copy))
    assert done.returncode == 1 and done.stdout == ""
    assert (
        done.stderr
        == f"clusterkit: job {sweep.array_id}_0 has no metrics yet ({copy}/metrics.jsonl): nothing to plot\n"
    )
    (copy / "metrics.jsonl").write_text(json.dumps({"event": "start", "step": 0, "max_steps": 4}) + "\n")
    assert plot(sweep, str(copy), "--json").returncode == 1
    assert not (copy / "curves.png").exists()
    # Beside a run that has metrics, it is left out with a note.
    done = plot(sweep, str(copy), f"{sweep.array_id}_1", "--json")
    assert done.returncode == 0 and [r["job_id"] for r in json.loads(done.stdout)["runs"]] == [f"{sweep.array_id}_1"]
    assert f"job {sweep.array_id}_0 has no metrics yet: left out" in done.stderr
    assert plot(sweep, "999999999").returncode == 2


def test_values_that_are_no_numbers_are_skipped(sweep: Sweep, tmp_path: Path) -> None:
    copy = _copy(sweep, tmp_path)
    real = (copy / "metrics.jsonl").read_text()
    hostile = [
        {"event": "log", "step": 5, "loss": "nan", "learning_rate": None, "samples_per_s": True},
        {"event": "log", "step": 6, "loss": float("nan"), "samples_per_s": float("inf")},
        {"event": "log", "step": True, "loss": 1.0},
        {"event": "log", "step": 2.5, "loss": 1.0},
        {"event": "log", "loss": 3.0},
        {"event": "log", "step": "7", "loss": 3.0},
        {"event": "log", "step": 10, "loss": None, "learning_rate": 1e-5},
        {"event": "log", "step": 2, "loss": 9.5},
    ]  # a resumed run logs step 2 again: the newer value
    (copy / "metrics.jsonl").write_text(
        real + "[1, 2]\n\n" + "".join(json.dumps(row) + "\n" for row in hostile) + '{"event": "log", "step": 11, "lo'
    )  # cut short by a killed rank
    done = plot(sweep, str(copy), "--json")
    assert done.returncode == 0, done.stderr
    series = json.loads(done.stdout)["runs"][0]["series"]
    steps, losses = logged(sweep.array_dir / "0", "loss")
    assert series["loss"] == {"steps": steps, "values": [losses[0], 9.5, *losses[2:]]}
    lr_steps, rates = logged(sweep.array_dir / "0", "learning_rate")
    assert series["learning_rate"] == {"steps": [*lr_steps, 10], "values": [*rates, 1e-5]}
    assert series["samples_per_s"]["steps"] == [1, 2, 3, 4]
    assert png_size(copy / "curves.png") == (900, 840)  # written beside the copy, odd path and all
    text = plot(sweep, str(copy))
    assert text.returncode == 0 and "┌" in text.stdout


def test_without_matplotlib_or_plotext_it_says_what_to_install(sweep: Sweep, tmp_path: Path) -> None:
    task = f"{sweep.array_id}_1"
    blocked = tmp_path / "blocked"
    for package in ("matplotlib", "plotext"):
        (blocked / package / package).mkdir(parents=True)
        (blocked / package / package / "__init__.py").write_text(f"raise ImportError('no {package} here')\n")

    def env(package: str, **extra: str) -> dict[str, str]:
        path = os.pathsep.join([str(blocked / package), str(REPO), os.environ.get("PYTHONPATH", "")])
        return {**no_display(), "PYTHONPATH": path, **extra}

    png = sweep.array_dir / "1" / "curves.png"
    png.unlink(missing_ok=True)
    done = plot(sweep, task, env=env("matplotlib"))
    assert done.returncode == 0, done.stderr
    assert "no PNG: matplotlib is not installed (pip install 'clusterkit[bench]')" in done.stderr
    assert "┌" in done.stdout and not png.exists()
    done = plot(sweep, task, "--json", env=env("matplotlib"))
    assert done.returncode == 0 and json.loads(done.stdout)["outputs"] == []
    done = plot(sweep, task, "-o", str(tmp_path / "c.png"), env=env("matplotlib"))
    assert done.returncode == 1 and "needs matplotlib: pip install 'clusterkit[bench]'" in done.stderr

    done = plot(sweep, task, env=env("plotext"))  # no display: the PNG, and a note instead of the chart
    assert done.returncode == 0 and png_size(png) == (900, 840)
    assert "no chart in the terminal: plotext is not installed (pip install 'clusterkit[bench]')" in done.stderr
    done = plot(sweep, task, "--terminal", env=env("plotext"))
    assert done.returncode == 1 and "needs plotext: pip install 'clusterkit[bench]'" in done.stderr


def test_the_sweep_table_names_the_plot_command(sweep: Sweep) -> None:
    status = run_cli("status", sweep.array_id, "--runs-dir", str(sweep.runs_dir))
    assert status.returncode == 0
    assert status.stdout.splitlines()[-1].startswith(f"curves: clusterkit plot {sweep.array_id}   (one line per TASK")
    table_tasks = [line.split()[0] for line in status.stdout.splitlines() if line.startswith(f"{sweep.array_id}_")]
    labels = [r["label"].split()[0] for r in json.loads(plot(sweep, sweep.array_id, "--json").stdout)["runs"]]
    assert labels == table_tasks  # each line's label starts with its TASK cell


def test_output_a_folder_another_format_or_one_it_cannot_write(sweep: Sweep, tmp_path: Path) -> None:
    task = f"{sweep.array_id}_0"
    done = plot(sweep, task, "-o", str(tmp_path), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["outputs"] == [str(tmp_path / "curves.png")]
    assert png_size(tmp_path / "curves.png") == (900, 840)
    assert plot(sweep, task, "-o", str(tmp_path / "c.svg")).returncode == 0
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml") and "<svg" in (tmp_path / "c.svg").read_text()
    done = plot(sweep, task, "-o", str(tmp_path / "c.xyz"))
    assert (
        done.returncode == 2
        and done.stderr.startswith(f"clusterkit: -o {tmp_path / 'c.xyz'}: ")
        and len(done.stderr.splitlines()) == 1
    )
    done = plot(sweep, task, "-o", str(tmp_path / "missing" / "c.png"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1


def test_a_run_that_logs_only_its_loss_gets_one_panel(sweep: Sweep, tmp_path: Path) -> None:
    copy = _copy(sweep, tmp_path)
    steps, losses = logged(sweep.array_dir / "0", "loss")
    (copy / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in zip(steps, losses))
    )
    done = plot(sweep, str(copy), "--json")
    assert json.loads(done.stdout)["runs"][0]["series"] == {"loss": {"steps": steps, "values": losses}}
    assert png_size(copy / "curves.png") == (900, 280)  # one panel
    chart = figure([curves_of("x", str(copy), metric_records((copy / "metrics.jsonl").read_text()))])
    assert [axes.get_title() for axes in chart.axes] == ["loss"]
    text = plot(sweep, str(copy)).stdout
    assert text.count("┌") == 1 and "samples/s" not in text


def _run_of_metrics(tmp_path: Path, rows: list[dict]) -> Path:
    """A finished local run holding ``rows`` as its metrics.jsonl, no training needed."""
    run_dir = tmp_path / "runs" / "x" / "41"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "job_id": "41",
                "name": "x",
                "scheduler": "local",
                "run_dir": str(run_dir),
                "recipe": "r.yaml",
                "submitted_at": 1.0,
                "nodes": 1,
                "ranks_per_node": 1,
                "launcher": "torchrun",
            }
        )
    )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


@pytest.mark.parametrize("huge", [1e308, -1e308, 1.7976931348623157e308, 1e301])
def test_a_value_too_large_to_draw_is_left_out_with_a_line(huge: float, tmp_path: Path) -> None:
    """A diverged loss (1e308) made the chart's range overflow: a traceback from plotext, or a PNG
    error blamed on -o. It is left out, said once, and the rest is drawn."""
    rows = [
        {"step": 1, "loss": 2.5, "learning_rate": 1e-3},
        {"step": 2, "loss": huge, "learning_rate": 1e-3},
        {"step": 3, "loss": -huge, "learning_rate": huge},
        {"step": 4, "loss": 1e300},
    ]
    run_dir = _run_of_metrics(tmp_path, rows)
    for args in ([], ["--json"], ["-o", str(tmp_path / "c.png")]):
        done = run_cli("plot", str(run_dir), *args, env=no_display())
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stderr.splitlines()[0] == (
            "clusterkit: job 41: 2 loss values and 1 learning rate value beyond ±1e+300 left out (too large to draw)"
        ), done.stderr
    assert json.loads(run_cli("plot", str(run_dir), "--json", env=no_display()).stdout)["runs"][0]["series"] == {
        "loss": {"steps": [1, 4], "values": [2.5, 1e300]},
        "learning_rate": {"steps": [1, 2], "values": [1e-3, 1e-3]},
    }
    assert png_size(tmp_path / "c.png") == (900, 560) and "┌" in run_cli("plot", str(run_dir), env=no_display()).stdout


def test_a_run_whose_every_value_is_too_large_has_nothing_to_plot(tmp_path: Path) -> None:
    run_dir = _run_of_metrics(tmp_path, [{"step": 1, "loss": 1e308}, {"step": 2, "loss": float("1e308") * -1}])
    done = run_cli("plot", str(run_dir), env=no_display())
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "clusterkit: job 41: 2 loss values beyond ±1e+300 left out (too large to draw)",
        f"clusterkit: job 41 has no metrics yet ({run_dir}/metrics.jsonl): nothing to plot",
    ]

"""bench/gpu (issue 25's proof on a lent GPU) must work the first time it meets the device machine:
its scripts parse and pass shellcheck, its arithmetic (tokens/s, MFU peak, plan vs measured) is
right, a run past its time limit is stopped with everything it started, and the script rehearses on
CPU: a part that fails is recorded, the next still runs, and it exits 1 naming the failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))  # bench/ is the repository's, not the installed package's
from bench.gpu.ablation import ROWS, RUN_ORDER, throughput  # noqa: E402
from bench.gpu.planner import compare  # noqa: E402
from bench.gpu.procs import run_logged  # noqa: E402
from bench.gpu.report import findings, render  # noqa: E402
from bench.gpu.sizes import bf16_peak, sizes_for  # noqa: E402

SCRIPTS = [REPO / "bench" / "gpu" / "run.sh", REPO / "bench" / "gpu" / "prepare-wheels.sh"]
DEVICE_COMMAND = "bash bench/gpu/run.sh"  # what the device call runs (at most 2000 characters there)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_pass_shellcheck(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    modules = ["main", "rank", "device", "ablation", "fsdp", "planner", "node", "job", "report"]
    done = subprocess.run(
        [sys.executable, "-c", "; ".join(f"import bench.gpu.{m}" for m in modules)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_run_sh_without_out_says_so_and_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(
        ["bash", str(SCRIPTS[0])], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2 and "set OUT" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("Tesla T4", None),
    ],
)
def test_the_bf16_peak_follows_the_device_name(name: str, peak: float | None) -> None:
    assert bf16_peak(name)[0] == peak


def test_the_device_sizes_fit_eight_minutes_and_a_part_budget_can_be_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_DEADLINE_S", raising=False)
    monkeypatch.setenv("BENCH_BUDGETS", "ablation=420, job=0")
    sizes = sizes_for("gpu")
    assert sizes.deadline_s <= 8 * 60 - 20 and sizes.model["hidden_size"] == 2048 and sizes.seq_len == 2048
    assert sizes.budgets["ablation"] == 420 and sizes.budgets["job"] == 0 and sizes.budgets["fsdp"] == 60


def test_tokens_per_second_are_timed_between_the_measured_steps_only() -> None:
    # warm-up step 2 took 9 s (compile); steps 3-5 one second each; the profiled step 6 is left out
    times = {1: 100.0, 2: 109.0, 3: 110.0, 4: 111.0, 5: 112.0, 6: 150.0}
    records = [{"event": "start", "time": 90.0, "step": 0}] + [
        {"event": "log", "step": s, "time": t} for s, t in times.items()
    ]
    result = throughput(records, warmup=2, measured=3, tokens_per_step=1000)
    assert result["tokens_per_s"] == pytest.approx(1000.0) and result["step_s"] == [1.0, 1.0, 1.0]
    cut_short = throughput(records[:4], warmup=2, measured=3, tokens_per_step=1000)  # died after step 3
    assert cut_short["tokens_per_s"] is None


def test_rows_run_in_a_priority_order_that_names_each_row_once() -> None:
    assert sorted(RUN_ORDER) == sorted(row.key for row in ROWS)
    assert RUN_ORDER[:5] == ("fp32", "bf16", "tf32", "fused", "sdpa")  # the seed-004 chain to the defaults first


def test_plan_against_measured_and_the_goals_missed_are_reported() -> None:
    estimate = {"layout": "dp1 tp1 pp1 zero0 mb1x8", "total": 30 * 2**30, "overhead": 3 * 2**30}
    data = {
        "parts": {
            "ablation": {
                "order": ["fp32", "sdpa"],
                "rows": {
                    "fp32": {
                        "label": "naive",
                        "status": "ok",
                        "tokens_per_s": 10_000.0,
                        "estimate": estimate,
                        "memory": {"peak_allocated": 25 * 2**30},
                    },
                    "sdpa": {
                        "label": "defaults",
                        "status": "ok",
                        "tokens_per_s": 20_000.0,
                        "mfu": 0.30,
                        "estimate": estimate,
                        "memory": {"peak_allocated": 29 * 2**30},
                    },
                },
            }
        }
    }
    data["planner_vs_measured"] = compare(data)
    ratios = {line["run"]: line for line in data["planner_vs_measured"]}
    assert ratios["ablation fp32"]["within_10pct"] is False and ratios["ablation sdpa"]["within_10pct"] is True
    missed = findings(data)
    assert any("MFU" in f and "30.0%" in f for f in missed) and any("2.00x the naive" in f for f in missed)
    assert any("ablation fp32" in f and "1.20x" in f for f in missed)
    page = render(data)
    assert "| naive | – x – | 10,000 |" in page and "## Goals missed" in page


def test_a_batch_plan_said_fits_but_did_not_is_a_miss_even_without_a_measured_peak() -> None:
    estimate = {"layout": "dp1 tp1 pp1 zero0 mb64x1 ckpt", "total": 77 * 2**30, "overhead": 7 * 2**30}
    row = {
        "label": "ckpt, the batch it fits",
        "status": "ok",
        "micro_batch": 32,
        "accumulation": 1,
        "tokens_per_s": 1.0,
        "estimate": {**estimate, "layout": "dp1 tp1 pp1 zero0 mb32x1 ckpt"},
        "memory": {"peak_allocated": 40 * 2**30},
        "oom_at_plan_batch": {"micro_batch": 64, "estimate": estimate, "memory": {"peak_allocated": None}},
    }
    data = {"parts": {"ablation": {"rows": {"defaults_ckpt_max": row}}}}
    data["planner_vs_measured"] = compare(data)
    oom = data["planner_vs_measured"][0]
    assert oom["run"] == "ablation defaults_ckpt_max, out of memory" and oom["within_10pct"] is False
    missed = findings(data)
    assert any("out of memory at micro batch 64, which plan said fits; micro batch 32 ran" in f for f in missed)
    assert any("not comparable with the measured peak" in f for f in missed)
    render(data)


def _gone(pid: int) -> bool:
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def test_a_run_past_its_limit_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    script = f"sleep 120 & echo $! > {pid_file}; echo started; wait"
    started = time.monotonic()
    outcome = run_logged(["bash", "-c", script], timeout_s=2, label="t")
    assert outcome.returncode is None and "time limit" in outcome.why() and outcome.tail == ["started"]
    assert _gone(int(pid_file.read_text())), "the sleep the run started outlived it"
    assert time.monotonic() - started < 30


def test_a_rank_in_a_session_of_its_own_is_stopped_with_the_run(tmp_path: Path) -> None:
    """torchrun starts each rank with start_new_session: a signal to torchrun's group misses it, and a
    rank left running would hold the GPU through every later row."""
    pid_file = tmp_path / "rank"
    script = f"setsid bash -c 'trap \"\" TERM; sleep 120' & echo $! > {pid_file}; trap '' TERM; wait"
    outcome = run_logged(["bash", "-c", script], timeout_s=2, label="t")
    assert outcome.returncode is None
    assert _gone(int(pid_file.read_text())), "the rank in its own session outlived the run"


def test_what_a_finished_run_left_running_goes_too(tmp_path: Path) -> None:
    """A leftover worker would hold the GPU (and its memory) into the next measured run."""
    pid_file = tmp_path / "straggler"
    outcome = run_logged(
        ["bash", "-c", f"sleep 120 >/dev/null & echo $! > {pid_file}; exit 3"], timeout_s=30, label="t"
    )
    assert outcome.returncode == 3 and outcome.why() == "exit status 3"
    assert _gone(int(pid_file.read_text())), "the run's leftover sleep is still running"


@pytest.mark.train
def test_cpu_rehearsal_records_a_failed_part_runs_the_next_and_exits_1(tmp_path: Path) -> None:
    """The script end to end on CPU (tiny sizes), one unknown part then the node part (doctor, a
    gloo preflight under torchrun): ~30 s."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "BENCH_PARTS": "bogus,node",
        "BENCH_WORK": str(tmp_path / "work"),
        "CLUSTERKIT_GPU_REHEARSAL": "1",
    }
    done = subprocess.run(
        ["bash", str(SCRIPTS[0])], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "bench: FAILED:\n  bogus: unknown part" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "rehearsal" and results["failures"] == ["bogus: unknown part"]
    node = results["parts"]["node"]
    assert node["status"] == "ok" and node["preflight"]["result"]["backend"] == "gloo"
    assert any(check["name"] == "torch" for check in node["doctor"]["checks"])
    assert "## doctor and preflight" in (out / "results.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "results.json", "results.md"]  # at most 8 come back

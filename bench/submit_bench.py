"""Benchmark on the dev cluster: clusterkit vs a hand-written sbatch + torchrun of the same training.

- submit -> first training step (wall seconds from the submit command to the first logged step)
- training samples/s (median of logged intervals after the first)

The hand-written baseline is the minimal script a user would write: #SBATCH header, srun one task
per node, torchrun with the static rendezvous, the same runner and job.json. Run from the repo root
with the dev cluster up:  python bench/submit_bench.py [--repeats 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
HAND_WRITTEN = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --partition=debug
#SBATCH --output={run_dir}/slurm.out
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 10000 + SLURM_JOB_ID % 20000 ))
srun bash -c 'python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=2 --node-rank=$SLURM_NODEID \\
  --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m clusterkit.runtime.runner {run_dir}/job.json'
"""


def _metrics(path: Path, timeout: float = 600) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if records and records[-1]["event"] == "end":
                return records
        time.sleep(0.5)
    raise TimeoutError(path)


def _summary(start: float, records: list[dict]) -> tuple[float, float]:
    logs = [r for r in records if r["event"] == "log"]
    first_step = logs[0]["time"] - start
    rates = [r["samples_per_s"] for r in logs[1:] if r.get("samples_per_s")]
    return first_step, statistics.median(rates)


def run_clusterkit(workdir: Path, steps: int) -> tuple[float, float]:
    start = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterkit.cli.main",
            "submit",
            str(RECIPE),
            "--set",
            f"runs_dir={workdir}",
            "--set",
            "task.trainer.args.logging_steps=1",
            "--set",
            f"task.trainer.args.max_steps={steps}",
            "--set",
            f"task.trainer.args.save_steps={steps}",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    run_dir = Path(next(line for line in done.stdout.splitlines() if line.startswith("run dir: ")).split(": ", 1)[1])
    return _summary(start, _metrics(run_dir / "metrics.jsonl"))


def run_hand_written(workdir: Path, steps: int) -> tuple[float, float]:
    # The same job.json (resolved recipe) clusterkit would hand the runner.
    render = workdir / "render"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterkit.cli.main",
            "render",
            str(RECIPE),
            "-o",
            str(render),
            "--set",
            "task.trainer.args.logging_steps=1",
            "--set",
            f"task.trainer.args.max_steps={steps}",
            "--set",
            f"task.trainer.args.save_steps={steps}",
        ],
        capture_output=True,
        check=True,
        cwd=REPO,
    )
    job_json = render.parent / "job.json"
    script_text = (render / "job.sbatch").read_text()
    job_json.write_text(script_text.split("<<'CLUSTERKIT_EOF'\n", 1)[1].split("CLUSTERKIT_EOF", 1)[0])
    script = workdir / "hand.sbatch"
    script.write_text(HAND_WRITTEN.format(run_dir=workdir))
    start = time.time()
    subprocess.run(["sbatch", str(script)], capture_output=True, check=True, cwd=REPO)
    return _summary(start, _metrics(workdir / "metrics.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"clusterkit": [], "hand-written": []}
    for _ in range(args.repeats):
        for name, runner in (("clusterkit", run_clusterkit), ("hand-written", run_hand_written)):
            with tempfile.TemporaryDirectory(dir=REPO / "runs" if (REPO / "runs").is_dir() else None) as tmp:
                results[name].append(runner(Path(tmp), args.steps))
    medians = {
        name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for name, rs in results.items()
    }
    for name, (first, rate) in medians.items():
        print(
            f"{name:>12}: submit -> first step {first:5.1f} s, training {rate:6.1f} samples/s (median of {args.repeats})"
        )
    ck, hw = medians["clusterkit"], medians["hand-written"]
    print(f"ratio: first step {ck[0] / hw[0]:.2f}x (target <= 1.2x), samples/s {ck[1] / hw[1]:.2f}x (target >= 0.95x)")


if __name__ == "__main__":
    main()

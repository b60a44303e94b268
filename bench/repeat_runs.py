"""Repeat the tiny 2 nodes x 2 ranks recipe on the dev cluster and count runs reported FAILED
although every rank finished (its rank record and the model written): the rare abort at interpreter
exit ("terminate called without an active exception") showed up about once in 30 such runs.

Each run is a real ``clusterkit submit --follow``, one after the other; ``--load [N]`` keeps N
(default 1) busy processes running in the background meanwhile (a loaded node makes exit-time races
likelier). Run from the repo root with the dev cluster up:

    python bench/repeat_runs.py --runs 60 --load [--steps 4] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
RANKS = 4


@dataclass(frozen=True)
class Outcome:
    run_dir: Path
    state: str
    exit_code: int | None
    failure: str | None
    ranks_finished: int  # rank records of ranks that reached the last step
    aborted_at_exit: bool  # "terminate called without an active exception" in a log
    seconds: float

    @property
    def spurious(self) -> bool:
        """Reported failed though all the work was done."""
        return self.state != "COMPLETED" and self.ranks_finished == RANKS and (self.run_dir / "model").is_dir()


def _busy() -> None:
    while True:
        pass


def _finished_ranks(run_dir: Path, steps: int) -> int:
    count = 0
    for path in run_dir.glob("ranks/rank-*.json"):
        try:
            count += json.loads(path.read_text())["global_step"] == steps
        except (OSError, ValueError, KeyError):
            continue
    return count


def _aborted(run_dir: Path) -> bool:
    logs = [*run_dir.glob("*_log.*"), *run_dir.glob("ranks/**/std*.log")]
    return any(
        "terminate called without an active exception" in p.read_text(errors="replace") for p in logs if p.is_file()
    )


def run_once(runs_dir: Path, steps: int) -> Outcome:
    started = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterkit.cli.main",
            "submit",
            str(RECIPE),
            "--follow",
            "--set",
            f"runs_dir={runs_dir}",
            "--set",
            f"task.trainer.args.max_steps={steps}",
            "--set",
            f"task.trainer.args.save_steps={steps}",
            "--set",
            "task.trainer.args.logging_steps=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    run_dirs = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run dir: ")]
    if not run_dirs:
        raise RuntimeError(f"submit printed no run dir:\n{done.stdout}\n{done.stderr}")
    run_dir = Path(run_dirs[0])
    status = json.loads(
        subprocess.run(
            [sys.executable, "-m", "clusterkit.cli.main", "status", str(run_dir), "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    return Outcome(
        run_dir,
        status["state"],
        status["exit_code"],
        status["failure"],
        _finished_ranks(run_dir, steps),
        _aborted(run_dir),
        time.time() - started,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--steps", type=int, default=4, help="max_steps of each run (default 4)")
    parser.add_argument(
        "--load",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="N busy processes in the background (default 1 when given)",
    )
    parser.add_argument("--runs-dir", type=Path, help="default: a new temporary directory")
    args = parser.parse_args()
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="repeat-runs-"))
    loaders = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for loader in loaders:
        loader.start()
    outcomes: list[Outcome] = []
    try:
        for number in range(1, args.runs + 1):
            outcome = run_once(runs_dir, args.steps)
            outcomes.append(outcome)
            mark = "SPURIOUS" if outcome.spurious else ""
            print(
                f"run {number}/{args.runs}: {outcome.state} exit {outcome.exit_code} ranks finished "
                f"{outcome.ranks_finished}/{RANKS} {outcome.seconds:.0f} s {outcome.run_dir} {mark}",
                flush=True,
            )
    finally:
        for loader in loaders:
            loader.terminate()
    completed = sum(o.state == "COMPLETED" for o in outcomes)
    spurious = [o for o in outcomes if o.spurious]
    failed = [o for o in outcomes if o.state != "COMPLETED"]
    print(
        f"\nruns: {len(outcomes)}  completed: {completed}  spurious failures: {len(spurious)}  "
        f"other failures: {len(failed) - len(spurious)}  busy background processes: {args.load}  "
        f"aborts at exit seen in logs: {sum(o.aborted_at_exit for o in outcomes)}"
    )
    for outcome in failed:
        print(
            f"  {outcome.run_dir}: {outcome.state} exit {outcome.exit_code}, ranks finished {outcome.ranks_finished}/{RANKS}"
            f"{', abort at exit' if outcome.aborted_at_exit else ''}; first failure: {outcome.failure}"
        )
    return 0 if completed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

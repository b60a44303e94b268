"""Benchmark on the dev cluster: how many times following many jobs asks SLURM.

Submits a job array of ``--jobs`` one-CPU tasks, each sleeping ``--sleep`` seconds (the dev cluster's
two nodes run four at a time: about a minute for 20 tasks of 10 s), follows it with ``clusterkit
submit --follow`` until every task ended, and counts the squeue / scontrol show / sacct calls it
made, through a PATH directory of wrappers that log each call and run the real command. Prints the
calls, calls per minute and jobs, and writes them as JSON. Run from the repo root with the dev
cluster up:

    python bench/polling.py [--jobs 20] [--sleep 10] [--output polling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SLEEPER = REPO / "tests" / "scripts" / "timed_sleep.py"
ASKING = ("squeue", "scontrol", "sacct")  # what a follower may call to learn a job's state


def counting_shims(shim_dir: Path, log: Path) -> None:
    """``squeue``, ``scontrol`` and ``sacct`` that append "<time> <argv>" to ``log`` and exec the real one."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    for command in ASKING:
        real = shutil.which(command)
        if real is None:
            continue
        path = shim_dir / command
        path.write_text(
            f'#!/bin/sh\nprintf "%s %s\\n" "$(date +%s.%N)" "{command} $*" >> "{log}"\nexec "{real}" "$@"\n'
        )
        path.chmod(0o755)


def status_calls(log: Path) -> list[tuple[float, str]]:
    """The logged calls that ask for a job's state (``scontrol release`` at submit is not one)."""
    calls = []
    for line in log.read_text().splitlines() if log.exists() else []:
        when, argv = line.split(" ", 1)
        if argv.startswith(("squeue", "sacct")) or argv.startswith("scontrol") and " show job" in argv:
            calls.append((float(when), argv))
    return calls


def follow_array(workdir: Path, jobs: int, sleep_s: float) -> dict:
    recipe = workdir / "polling.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "polling",
                "cluster": "dev",
                "runs_dir": str(workdir / "runs"),
                "launcher": "python",
                "resources": {
                    "nodes": 1,
                    "gpus_per_node": 1,
                    "cpus_per_task": 1,
                    "time": "5",
                    "array": f"0-{jobs - 1}",
                },
                "task": {"script": str(SLEEPER), "args": [str(sleep_s)]},
            }
        )
    )
    log = workdir / "calls.log"
    counting_shims(workdir / "shims", log)
    env = {**os.environ, "PATH": f"{workdir / 'shims'}{os.pathsep}{os.environ['PATH']}"}
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", "submit", str(recipe), "--follow"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    seconds = time.time() - start
    if "submitted job" not in done.stdout:
        raise SystemExit(f"submit failed:\n{done.stdout}{done.stderr}")
    calls = status_calls(log)
    by_command = Counter(argv.split()[0] + (" show job" if argv.startswith("scontrol") else "") for _, argv in calls)
    job_id = done.stdout.split("submitted job ", 1)[1].split()[0]
    states = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "clusterkit.cli.main",
                "status",
                job_id,
                "--json",
                "--runs-dir",
                str(workdir / "runs"),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
    )
    return {
        "jobs": jobs,
        "sleep_s": sleep_s,
        "follow_s": round(seconds, 1),
        "exit_code": done.returncode,
        "calls": len(calls),
        "calls_per_minute": round(len(calls) / seconds * 60, 1),
        "by_command": dict(by_command),
        "states": dict(Counter(task["state"] for task in states["tasks"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20, help="tasks in the array (default 20)")
    parser.add_argument("--sleep", type=float, default=10.0, help="seconds each task sleeps (default 10)")
    parser.add_argument("--output", default="polling.json", help="where the JSON goes (default polling.json)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ck-polling-") as tmp:
        result = follow_array(Path(tmp), args.jobs, args.sleep)
    print(
        f"followed {result['jobs']} jobs for {result['follow_s']} s: {result['calls']} SLURM status calls, "
        f"{result['calls_per_minute']} per minute ({', '.join(f'{n} {c}' for c, n in result['by_command'].items())}); "
        f"tasks: {result['states']}"
    )
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

"""Benchmark: how long the quick commands take to start, against a bare interpreter. Each is a
fresh process, as a user runs it, with its bytecode and the compiled templates already cached: the
median of N runs of `python -c pass`, `clusterkit --help`, `clusterkit validate` and `clusterkit
render` of a shipped recipe, and each median as a ratio to the bare interpreter's (a measurement,
not a target). One more row is the floor under validate: the interpreter importing only the
libraries it cannot do without (re, which the console script itself imports, typing, pathlib,
PyYAML, msgspec). Both the wall time and the CPU time (user + system) of each process: on a shared,
busy machine the wall time mostly measures the other processes, the CPU time much less so. Printed,
and written as JSON.

    python bench/startup.py [--runs 30] [--output startup.json]

Run it with the interpreter of the install to measure (a venv's python measures that venv's
console script and its site-packages; this checkout's python, the editable install).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from render_bench import cli_argv

RECIPE = "tiny-gpt2-cpu"  # a shipped recipe, named as from any directory


def measure(command: list[str], runs: int) -> tuple[float, float]:
    """The median wall and CPU seconds of ``runs`` runs, after one that warms the caches."""
    subprocess.run(command, check=True, capture_output=True)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--output", default="startup.json", help="where the JSON goes (default ./startup.json)")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the first (warm-up) run of each writes the bytecode
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = tmp  # and the compiled templates, apart from the user's cache
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "clusterkit --help": [*cli_argv(), "--help"],
            "validate's libraries": [sys.executable, "-c", "import re, typing, pathlib, yaml, msgspec"],
            "clusterkit validate": [*cli_argv(), "validate", "-q", RECIPE],
            "clusterkit render": [*cli_argv(), "render", RECIPE, "-o", f"{tmp}/out"],
        }
        medians = {label: measure(command, args.runs) for label, command in commands.items()}
    bare_wall, bare_cpu = medians["python -c pass"]
    report = {
        "python": sys.version.split()[0],
        "interpreter": sys.executable,
        "runs": args.runs,
        "median_wall_ms": {label: round(wall * 1000, 2) for label, (wall, _) in medians.items()},
        "median_cpu_ms": {label: round(cpu * 1000, 2) for label, (_, cpu) in medians.items()},
        "wall_ratio": {label: round(wall / bare_wall, 2) for label, (wall, _) in medians.items()},
        "cpu_ratio": {label: round(cpu / bare_cpu, 2) for label, (_, cpu) in medians.items()},
    }
    for label, (wall, cpu) in medians.items():
        print(
            f"{label:<22} wall {wall * 1000:6.1f} ms {wall / bare_wall:4.1f}x   cpu {cpu * 1000:6.1f} ms {cpu / bare_cpu:4.1f}x"
        )
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

"""Benchmark: how long a TAB takes. Each kind of completion is answered by a fresh process, as the
shell starts one (``$_ARGCOMPLETE`` set, the line in ``COMP_LINE``), with a user config and a run
index of 1,000 runs; the median is printed beside a bare ``python -c pass`` for scale.
Target: at most ~100 ms over the bare interpreter.

    python bench/completion_bench.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = {
    "command": "clusterkit sta",
    "option": "clusterkit submit --dr",
    "recipe file": "clusterkit submit ",
    "cluster profile": "clusterkit submit r.yaml --cluster ",
    "job id": "clusterkit status 1",
    "--set key path": "clusterkit submit r.yaml --set resources.n",
}


def median_ms(argv: list[str], env: dict[str, str], cwd: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "config" / "clusterkit").mkdir(parents=True)
        (home / "config" / "clusterkit" / "config.yaml").write_text(f"profile_dirs: [{home}]\nruns_dir: {home}/runs\n")
        (home / "state" / "clusterkit").mkdir(parents=True)
        with open(home / "state" / "clusterkit" / "runs.jsonl", "w") as index:
            for n in range(1000):
                run_dir = home / "runs" / "x" / str(100000 + n)
                run_dir.mkdir(parents=True)
                (run_dir / "run.json").write_text("{}")
                index.write(
                    json.dumps(
                        {
                            "job_id": str(100000 + n),
                            "name": "x",
                            "scheduler": "local",
                            "record_dir": str(run_dir),
                            "submitted_at": n,
                        }
                    )
                    + "\n"
                )
        env = {**os.environ, "XDG_CONFIG_HOME": str(home / "config"), "XDG_STATE_HOME": str(home / "state")}
        bare = median_ms([sys.executable, "-c", "pass"], env, tmp, runs)
        print(f"{'python -c pass':<18} {bare:6.0f} ms")
        for kind, line in LINES.items():
            answer = home / "answer"  # where argcomplete writes the completions (else to fd 8)
            asked = {
                **env,
                "_ARGCOMPLETE": "1",
                "COMP_LINE": line,
                "COMP_POINT": str(len(line)),
                "_ARGCOMPLETE_IFS": "\v",
                "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
            }
            took = median_ms([sys.executable, "-m", "clusterkit"], asked, tmp, runs)
            offered = answer.read_text().split("\v")
            print(f"{kind:<18} {took:6.0f} ms  (+{took - bare:.0f} ms)  {len(offered)} offered, e.g. {offered[0]}")


if __name__ == "__main__":
    main()

"""One step of a job of several steps (tests/test_job_steps.py): records what it was told (its
arguments, step, trial and rank) in <run dir>/probe/<step>-<trial>-<rank>.json, prints a line to
its log, and exits with the number after --exit (0 without one)."""

import json
import os
import sys
from pathlib import Path

step, trial, rank = os.environ["CLUSTERKIT_STEP"], os.environ["CLUSTERKIT_TRIAL"], os.environ.get("RANK", "0")
folder = Path(os.environ["RUN_DIR"]) / "probe"
folder.mkdir(exist_ok=True)
told = {"argv": sys.argv[1:], "step": step, "trial": trial, "rank": rank, "seed": os.environ.get("SEED")}
(folder / f"{step}-{trial}-{rank}.json").write_text(json.dumps(told))
print(f"step_probe: step {step} trial {trial} rank {rank}", flush=True)
code = int(sys.argv[sys.argv.index("--exit") + 1]) if "--exit" in sys.argv else 0
sys.exit(code)

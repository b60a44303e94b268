"""Stands in for a node that dies once: the first time it runs, the rank on node 1 kills itself
(SIGKILL, no cleanup); afterwards every rank notes where it ran and exits 0."""

import os
import signal
from pathlib import Path

run_dir = Path(os.environ["RUN_DIR"])
if os.environ["SLURM_NODEID"] == "1" and not (run_dir / "died").exists():
    (run_dir / "died").write_text(os.environ["SLURMD_NODENAME"])
    os.kill(os.getpid(), signal.SIGKILL)
(run_dir / f"ran-on-{os.environ['RANK']}").write_text(os.environ["SLURMD_NODENAME"])

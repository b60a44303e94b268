"""A user script for tests: each rank records whether it started with the preemption signal at its
default, installs a handler (Lightning's way: only where none is set), says it is ready, and ends
when the signal comes, recording that it did."""

import os
import signal
import sys
import time
from pathlib import Path

rank = os.environ["RANK"]
name = os.environ["CLUSTERKIT_PREEMPT_SIGNAL"]
signum = getattr(signal, f"SIG{name}")
out = Path(os.environ["RUN_DIR"]) / "preemption"
out.mkdir(exist_ok=True)
at_start = signal.getsignal(signum)
(out / f"rank-{rank}.start").write_text("default" if at_start == signal.SIG_DFL else "ignored")


def preempted(number, frame):
    (out / f"rank-{rank}.got").write_text(name)
    sys.exit(0)


if at_start == signal.SIG_DFL:  # as Lightning's SLURM auto-requeue: it arms only where nothing else did
    signal.signal(signum, preempted)
(out / f"rank-{rank}.ready").write_text("")
time.sleep(120)
sys.exit(5)  # the signal never came

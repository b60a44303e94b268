"""Holds its node for a long time, for the local executor's process tests: ``--fail-node N`` makes
the rank on node N exit 3 at once; ``--ignore-term`` makes every rank ignore SIGTERM."""

import argparse
import os
import signal
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--fail-node", type=int)
parser.add_argument("--ignore-term", action="store_true")
args = parser.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
node = int(os.environ["SLURM_NODEID"])
Path(os.environ["RUN_DIR"], f"started-{node}").write_text(str(os.getpid()))
if node == args.fail_node:
    raise SystemExit(3)
time.sleep(600)

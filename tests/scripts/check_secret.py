"""A user script for tests: each rank checks that secret NAME (argv[1]) reached its environment with
the bytes whose SHA-256 is argv[2], and records only ok/mismatch (never the value) in the run directory."""

import hashlib
import os
import sys
from pathlib import Path

name, expected = sys.argv[1], sys.argv[2]
value = os.environb.get(name.encode())
verdict = "missing" if value is None else "ok" if hashlib.sha256(value).hexdigest() == expected else "mismatch"
out = Path(os.environ["RUN_DIR"]) / "secret-check"
out.mkdir(exist_ok=True)
(out / f"rank-{os.environ['RANK']}").write_text(verdict)
sys.exit(0 if verdict == "ok" else 3)

"""A user script for tests: writes the words it was given (as text and as the bytes the kernel
passed) and the environment variables named in $ARGV_JSON_ENV, one JSON file per rank."""

import json
import os
import sys
from pathlib import Path

names = [name for name in os.environ.get("ARGV_JSON_ENV", "").split(",") if name]
out = Path(os.environ["RUN_DIR"]) / "argv"
out.mkdir(exist_ok=True)
(out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(
    json.dumps(
        {
            "argv": sys.argv[1:],
            "argv_hex": [os.fsencode(arg).hex() for arg in sys.argv[1:]],
            "env": {name: os.environ.get(name) for name in names},
            "env_hex": {name: os.environb[os.fsencode(name)].hex() for name in names if name in os.environ},
            "node": os.environ.get("SLURMD_NODENAME"),
        }
    )
)

"""Records which rendezvous port and node this job got (for the concurrency test)."""

import json
import os
from pathlib import Path

Path(os.environ["RUN_DIR"], "port.json").write_text(
    json.dumps(
        {
            "port": int(os.environ["MASTER_PORT"]),
            "node": os.environ.get("SLURMD_NODENAME"),
            "job": os.environ.get("SLURM_JOB_ID"),
        }
    )
)

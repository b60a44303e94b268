"""Sleeps argv[1] seconds; records when each rank started and finished in $RUN_DIR/timed-<rank>.json."""

import json
import os
import sys
import time
from pathlib import Path

started = time.time()
time.sleep(float(sys.argv[1]))
Path(os.environ["RUN_DIR"], f"timed-{os.environ['RANK']}.json").write_text(
    json.dumps({"started": started, "finished": time.time()})
)

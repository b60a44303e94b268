"""Stands in for a node that dies: on the run's first attempt (no CLUSTERKIT_RETRY yet) every rank
on the node kills itself (SIGKILL, no cleanup), after noting the node; on a retry the ranks note
where they ran and exit 0."""

import os
import signal
from pathlib import Path

run_dir = Path(os.environ["RUN_DIR"])
node = os.environ["SLURMD_NODENAME"]
if not os.environ.get("CLUSTERKIT_RETRY"):
    if os.environ["LOCAL_RANK"] == "0":
        (run_dir / "died-on").write_text(node)
    os.kill(os.getpid(), signal.SIGKILL)
(run_dir / f"ran-on-{os.environ['RANK']}").write_text(node)

"""``python -m clusterkit.schedulers.local_array RUN_DIR THROTTLE SCRIPT KIND INDEX...``: the local
executor's job array. Runs the array's batch script once per task index, at most THROTTLE at a time,
each as SLURM runs an array task: its own numeric job id, ``SLURM_ARRAY_JOB_ID``,
``SLURM_ARRAY_TASK_ID``, and its output in ``<RUN_DIR>/<index>/`` (KIND ``array``) or, for a
chain's links, in ``RUN_DIR`` itself (KIND ``chain``).

Every process of a task carries the task's job marker (``cancel`` of one task finds them) and the
array's marker (``cancel`` of the array finds them all, this process included)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from clusterkit.schedulers.local import allocate_job_id
from clusterkit.schedulers.local_slurm import ARRAY_MARKER, JOB_MARKER
from clusterkit.spec.arrays import task_job_id
from clusterkit.spec.layout import LOCAL_JOB_IDS, SHIM_DIR, batch_log


def _start(run_dir: Path, script: str, kind: str, index: int) -> subprocess.Popen[bytes]:
    array_id, task_dir = run_dir.name, run_dir / str(index) if kind == "array" else run_dir
    job_id = allocate_job_id(run_dir.parent.parent / LOCAL_JOB_IDS, time.time_ns() // 1_000_000 % 1_000_000_000)
    env = dict(
        os.environ,
        SLURM_JOB_ID=job_id,
        SLURM_ARRAY_JOB_ID=array_id,
        SLURM_ARRAY_TASK_ID=str(index),
        PATH=f"{run_dir / SHIM_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
        **{JOB_MARKER: str(task_dir), ARRAY_MARKER: str(run_dir)},
    )
    name = task_job_id(array_id, index)
    with open(task_dir / batch_log(name, "out"), "ab") as out, open(task_dir / batch_log(name, "err"), "ab") as err:
        return subprocess.Popen(
            ["bash", str(run_dir / script)], stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env
        )


def main(argv: list[str]) -> int:
    run_dir, throttle, script, kind, indices = Path(argv[0]), int(argv[1]), argv[2], argv[3], [int(i) for i in argv[4:]]
    waiting, running, failed = list(indices), [], 0
    while waiting or running:
        while waiting and len(running) < throttle:
            running.append(_start(run_dir, script, kind, waiting.pop(0)))
        time.sleep(0.2)
        finished = [task for task in running if task.poll() is not None]
        failed += sum(1 for task in finished if task.returncode != 0)
        running = [task for task in running if task not in finished]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

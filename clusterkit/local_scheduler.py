"""The local adapter: runs the same batch script on this machine, with ``srun`` and ``scontrol``
stand-ins (:mod:`clusterkit.local_slurm`) that start one process per node — the same env contract
as SLURM, so a laptop can try a recipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from clusterkit.jobstate import CANCELLED_MARKER
from clusterkit.runs import RunRecord
from clusterkit.submission import SubmitRequest, write_run_files

SHIMS = ("srun", "scontrol")


def _allocate_run_dir(root: Path) -> tuple[str, Path]:
    """A numeric job id (the script does arithmetic on it) whose run directory is new."""
    job_id = int(time.time() * 1000) % 1_000_000_000
    while True:
        try:
            (root / str(job_id)).mkdir(parents=True)
            return str(job_id), root / str(job_id)
        except FileExistsError:
            job_id += 1


def local_hosts(nodes: int) -> list[str]:
    """Distinct loopback addresses stand in for node names (all reach this machine on Linux)."""
    return [f"127.0.0.{index + 1}" for index in range(nodes)]


def submit(request: SubmitRequest) -> RunRecord:
    job_id, run_dir = _allocate_run_dir(request.runs_root)
    write_run_files(request, run_dir)
    shim_dir = run_dir / ".local-bin"
    shim_dir.mkdir()
    for shim in SHIMS:
        path = shim_dir / shim
        # A Python script, not /bin/sh: dash would drop the exported clusterkit_node function
        # (BASH_FUNC_clusterkit_node%%) from the environment the nodes' commands need.
        path.write_text(f"#!{sys.executable}\nimport sys\nfrom clusterkit.local_slurm import main\nsys.exit(main({shim!r}, sys.argv[1:]))\n")
        path.chmod(0o755)
    hosts = local_hosts(request.nodes)
    env = dict(os.environ)
    env.update(
        PATH=f"{shim_dir}{os.pathsep}{env.get('PATH', '')}",
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME=request.name,
        SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_NNODES=str(request.nodes),
        CLUSTERKIT_EXECUTOR="local",
    )
    log_base = run_dir / f"{job_id}_0_log"
    with open(f"{log_base}.out", "ab") as out, open(f"{log_base}.err", "ab") as err:
        process = subprocess.Popen(
            ["bash", str(run_dir / "job.sbatch")], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,  # its own process group: cancel stops all of it
        )
    record = RunRecord(
        job_id=job_id, name=request.name, scheduler="local", run_dir=str(run_dir), recipe=request.recipe,
        submitted_at=time.time(), nodes=request.nodes, ranks_per_node=request.ranks_per_node,
        launcher=request.launcher, pid=process.pid, overrides=request.overrides,
    )
    record.write()
    return record


def cancel(record: RunRecord) -> None:
    (record.path / CANCELLED_MARKER).touch()
    if record.pid:
        try:
            os.killpg(record.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

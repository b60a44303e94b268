"""Who a process is in the job: the torch.distributed variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, NODE_RANK) from the ids its launcher gave it, and the run-time values of a node
or task (``{node_rank}``, ``{rank}``, ...) that :func:`.plan.expand` puts into arguments.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from typing import Dict, List, Mapping, Optional

from .plan import ENV_PREFIX

# (rank, local rank, world size, local world size) as each MPI launcher names them. Under mpirun the
# SLURM_* task variables are the per-node daemon's (SLURM_PROCID is the node's number), so these win.
MPI_IDS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),  # MPICH / Intel MPI (Hydra)
)


def task_ids(environ: Mapping[str, str]) -> Dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK of a process started as one rank: from
    the MPI launcher's variables where one started it, else from srun's task variables. Only the
    ones known, and none that is already set (a value set on purpose wins)."""
    mpi = next((names for names in MPI_IDS if all(name in environ for name in names)), None)
    if mpi:
        rank, local, world, local_world = (environ[name] for name in mpi)
        # The daemon's srun task is one per node, so its SLURM_NODEID is the node's number.
        node: Optional[str] = environ.get("SLURM_NODEID") or str(int(rank) // int(local_world))
        mapped = {
            "RANK": rank,
            "LOCAL_RANK": local,
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": local_world,
            "NODE_RANK": node,
        }
    else:
        mapped = {
            "RANK": environ.get("SLURM_PROCID"),
            "LOCAL_RANK": environ.get("SLURM_LOCALID"),
            "WORLD_SIZE": environ.get("SLURM_NTASKS"),
            "NODE_RANK": environ.get("SLURM_NODEID"),
            "LOCAL_WORLD_SIZE": (environ.get("SLURM_TASKS_PER_NODE") or "").split("(")[0] or None,
        }
    return {name: value for name, value in mapped.items() if value is not None and name not in environ}


def node_ids(environ: Mapping[str, str]) -> Dict[str, str]:
    """NODE_RANK of a launcher started once per node (srun's node id), unless already set."""
    node = environ.get("SLURM_NODEID")
    return {"NODE_RANK": node} if node is not None and "NODE_RANK" not in environ else {}


def runtime_values(environ: Mapping[str, str]) -> Dict[str, str]:
    """Every run-time value this process knows, for :func:`.plan.expand`: the job's (exported by the
    supervisor), in a step's task the node's and the task's (from srun's variables), and each
    variable of ``environ`` as ``env:NAME``."""
    known = {
        "job_id": environ.get("CLUSTERKIT_JOB_ID"),  # an array task's is <array id>_<task id>
        "run_dir": environ.get("RUN_DIR"),
        "master_addr": environ.get("MASTER_ADDR"),
        "master_port": environ.get("MASTER_PORT"),
        "node_rank": environ.get("SLURM_NODEID"),
        "hostname": environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "uid": str(os.getuid()),  # whose files a container writes (docker run --user)
        "gid": str(os.getgid()),
        "rank": environ.get("SLURM_PROCID"),
        "local_rank": environ.get("SLURM_LOCALID"),
        "trial": environ.get("CLUSTERKIT_TRIAL"),  # set by the supervisor for each step of several
    }
    values = {ENV_PREFIX + name: value for name, value in environ.items()}
    values.update((name, value) for name, value in known.items() if value is not None)
    return values


def run_as_rank(argv: List[str]) -> None:
    """``supervisor rank [--module] ENTRY ARGS...``: the program of each rank that a launcher in the
    batch shell starts (DeepSpeed's ``--launcher slurm`` sets no RANK; mpirun starts it under a
    daemon per node): the ids mapped as :func:`task_ids` says, then ENTRY run as ``python`` would."""
    module = bool(argv) and argv[0] == "--module"
    entry, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    os.environ.update(task_ids(os.environ))
    register_stacks = getattr(sys, "_clusterkit_register_stacks", None)  # site/sitecustomize.py, now RANK is set
    if register_stacks is not None:
        register_stacks()
    sys.argv = [entry, *args]
    if module:
        sys.path[0] = os.getcwd()  # as `python -m` has it
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(entry))  # as `python script.py` has it
        runpy.run_path(entry, run_name="__main__")

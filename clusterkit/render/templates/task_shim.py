"""``python -u $RUN_DIR/task_shim.py [--module] ENTRY ARGS...``: the program of each rank that a launcher
in the batch shell starts (DeepSpeed's ``--launcher slurm`` runs ``python -u <file> <args>`` in an srun
task and sets no RANK; mpirun starts it under a daemon per node). It maps the rank's ids — the MPI
launcher's where one started it, else the SLURM task's — to the torch.distributed variables, then runs
ENTRY (a script path, or a module with ``--module``) as ``python`` would, with ARGS as its argv.

Copied into the run directory by render (not imported from clusterkit): the job's interpreter needs
nothing but its standard library, any Python 3, so a script's environment is untouched.
"""

import os
import runpy
import sys

# (rank, local rank, world size, local world size) as each MPI launcher names them. Under mpirun the
# SLURM_* task variables are the per-node daemon's (SLURM_PROCID is the node's number), so these win.
MPI_IDS = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),  # Open MPI
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),  # MPICH / Intel MPI (Hydra)
)


def torch_env(environ: dict) -> dict:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK from the MPI launcher's variables or
    else srun's task variables (a value already set wins)."""
    mpi = next((names for names in MPI_IDS if all(name in environ for name in names)), None)
    if mpi:
        rank, local, world, local_world = (environ[name] for name in mpi)
        # The daemon's srun task is one per node, so its SLURM_NODEID is the node's number.
        node = environ.get("SLURM_NODEID") or str(int(rank) // int(local_world))
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


def main(argv: list) -> None:
    module = bool(argv) and argv[0] == "--module"
    entry, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    os.environ.update(torch_env(dict(os.environ)))
    if module:
        sys.argv = [entry, *args]
        sys.path[0] = os.getcwd()  # as `python -m` has it
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [entry, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(entry))  # as `python script.py` has it
        runpy.run_path(entry, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])

"""``python -u .../slurm_task.py [--module] ENTRY ARGS...``: the program of each task that a launcher in
the batch shell starts through srun (DeepSpeed's ``--launcher slurm`` runs ``python -u <file> <args>``
there and sets no RANK). It maps the task's SLURM ids to the torch.distributed variables, then runs
ENTRY (a script path, or a module with ``--module``) as ``python`` would, with ARGS as its argv.

Run as a file, not imported: it imports nothing of clusterkit, so a script's own imports are untouched.
"""

import os
import runpy
import sys


def torch_env(environ: dict) -> dict:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK from srun's task variables (a value
    already set wins)."""
    mapped = {"RANK": environ.get("SLURM_PROCID"), "LOCAL_RANK": environ.get("SLURM_LOCALID"),
              "WORLD_SIZE": environ.get("SLURM_NTASKS"), "NODE_RANK": environ.get("SLURM_NODEID"),
              "LOCAL_WORLD_SIZE": (environ.get("SLURM_TASKS_PER_NODE") or "").split("(")[0] or None}
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

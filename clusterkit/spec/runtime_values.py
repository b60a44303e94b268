"""Run-time values: ``{name}`` in an env value or a script argument stands for what is known only when
the job runs. Each is expanded where it is first known, as quoted shell:

- ``{job_id}``, ``{run_dir}``: in the batch shell (``$SLURM_JOB_ID``, ``$RUN_DIR``);
- ``{node_rank}``: on each node, in the launch step (``$SLURM_NODEID``);
- ``{rank}``, ``{local_rank}``: in each task (``$SLURM_PROCID``, ``$SLURM_LOCALID``), so only where
  srun starts one task per rank (launcher: python); torchrun and DeepSpeed start the ranks
  themselves, which read RANK and LOCAL_RANK from their environment.

Only these five names in braces are replaced; any other text (``${HOME}``, ``{x}``) stays as written.
"""

from __future__ import annotations

import re

BATCH, NODE, TASK = "batch", "node", "task"
# name -> (when it is known, the shell variable that holds it then)
RUNTIME_VALUES = {
    "job_id": (BATCH, "SLURM_JOB_ID"),
    "run_dir": (BATCH, "RUN_DIR"),
    "node_rank": (NODE, "SLURM_NODEID"),
    "rank": (TASK, "SLURM_PROCID"),
    "local_rank": (TASK, "SLURM_LOCALID"),
}
PLACEHOLDER = re.compile(r"\{(" + "|".join(RUNTIME_VALUES) + r")\}")


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def expanded_late(text: str) -> bool:
    """Whether ``text`` holds a value known only on a node or in a task (not in the batch shell)."""
    return any(RUNTIME_VALUES[name][0] != BATCH for name in placeholders(text))

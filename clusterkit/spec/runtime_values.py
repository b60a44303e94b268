"""Run-time values: ``{name}`` in an env value or a script argument stands for what is known only when
the job runs (the names and the expansion are the job's own: :mod:`clusterkit.supervisor.plan`):

- ``{job_id}``, ``{run_dir}``: the job's (``$CLUSTERKIT_JOB_ID``: as ``clusterkit status`` names it, an
  array task's ``<array id>_<task id>``; ``$RUN_DIR``), known in the batch shell;
- ``{master_addr}``, ``{master_port}``: the rendezvous, once the supervisor has chosen it;
- ``{node_rank}``, ``{hostname}``: on each node, in the launch step;
- ``{rank}``, ``{local_rank}``: in each task (``$SLURM_PROCID``, ``$SLURM_LOCALID``), so only where
  srun starts one task per rank (launcher: python or srun); torchrun and DeepSpeed start the ranks
  themselves, which read RANK and LOCAL_RANK from their environment.

Only these names in braces are replaced; any other text (``${HOME}``, ``{x}``) stays as written.
An env value's ``{job_id}`` and ``{run_dir}`` are expanded by the batch script's own environment
lines; every other value is filled in by the supervisor and the node agent, in one pass.
"""

from __future__ import annotations

import re

from clusterkit.supervisor.plan import NODE_VALUES, TASK_VALUES
from clusterkit.supervisor.plan import RUNTIME_VALUES as NAMES

BATCH, NODE, TASK = "batch", "node", "task"
# name -> when it is known: the batch shell (also the rendezvous, known before any step), a node, a task
WHEN = {name: TASK if name in TASK_VALUES else NODE if name in NODE_VALUES else BATCH for name in NAMES}
# The ones the batch script's environment lines expand themselves, and the shell variable holding each.
IN_BATCH_SHELL = {"job_id": "CLUSTERKIT_JOB_ID", "run_dir": "RUN_DIR"}
PLACEHOLDER = re.compile(r"\{(" + "|".join(NAMES) + r")\}")


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def expanded_late(text: str) -> bool:
    """Whether ``text`` holds a value the batch script's environment lines cannot fill in (the
    supervisor or the node agent does)."""
    return any(name not in IN_BATCH_SHELL for name in placeholders(text))

"""Run-time values: ``{name}`` in an env value or a script argument stands for what is known only when
the job runs (the names and the expansion are the job's own: :mod:`clusterkit.supervisor.plan`):

- ``{job_id}``, ``{run_dir}``: the job's (``$CLUSTERKIT_JOB_ID``: as ``clusterkit status`` names it, an
  array task's ``<array id>_<task id>``; ``$RUN_DIR``), known in the batch shell;
- ``{master_addr}``, ``{master_port}``: the rendezvous, once the supervisor has chosen it;
- ``{node_rank}``, ``{hostname}``: on each node, in the launch step;
- ``{rank}``, ``{local_rank}``: in each task (``$SLURM_PROCID``, ``$SLURM_LOCALID``), so only where
  srun starts one task per rank (launcher: python); torchrun and DeepSpeed start the ranks
  themselves, which read RANK and LOCAL_RANK from their environment.

- ``{env:NAME}``: the variable NAME of the job's environment where the value is filled in (a
  site's ``$SCRATCH``, ``$TMPDIR``): in a task's argument or env value, the node's; in a container's
  image or mounts, the batch shell's. Inserted as text, never read by a shell; a variable that is not
  set there fails the job with a line naming it.

Only these names in braces are replaced; any other text (``${HOME}``, ``{x}``) stays as written.
An env value's ``{job_id}`` and ``{run_dir}`` are expanded by the batch script's own environment
lines; every other value is filled in by the supervisor and the node agent, in one pass.
"""

from __future__ import annotations

import re

from clusterkit.supervisor.plan import ENV_NAME, ENV_PREFIX, NODE_VALUES, TASK_VALUES
from clusterkit.supervisor.plan import RUNTIME_VALUES as NAMES

BATCH, NODE, TASK = "batch", "node", "task"
# The ones the batch script's environment lines expand themselves, and the shell variable holding each.
IN_BATCH_SHELL = {"job_id": "CLUSTERKIT_JOB_ID", "run_dir": "RUN_DIR"}
PLACEHOLDER = re.compile(r"\{(" + "|".join(NAMES) + "|" + ENV_PREFIX + ENV_NAME + r")\}")
# What starts an {env:...} reference, well formed or not: each must be one (a misspelt one would stay as text).
_ENV_START = re.compile(r"\{\s*env\s*:")
_ENV_REFERENCE = re.compile(r"\{" + ENV_PREFIX + ENV_NAME + r"\}")


def when(name: str) -> str:
    """When the value ``name`` is known: the batch shell (also the rendezvous, known before any
    step, and an environment variable, known wherever clusterkit fills one in), a node, a task."""
    return TASK if name in TASK_VALUES else NODE if name in NODE_VALUES else BATCH


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def malformed_env(text: str) -> str | None:
    """The first ``{env:...}`` of ``text`` that names no variable (``{env:}``, ``{env:1X}``,
    ``{env:A-B}``, an unclosed one), as written; None when every one is well formed."""
    for start in _ENV_START.finditer(text):
        if not _ENV_REFERENCE.match(text, start.start()):
            end = text.find("}", start.start())
            return text[start.start() : len(text) if end < 0 else end + 1]
    return None


def expanded_late(text: str) -> bool:
    """Whether ``text`` holds a value the batch script's environment lines cannot fill in (the
    supervisor or the node agent does)."""
    return any(name not in IN_BATCH_SHELL for name in placeholders(text))

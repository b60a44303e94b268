"""The run directory's names that the job's supervisor writes or reads. clusterkit.spec.layout, which
owns every name of the run directory, takes these from here (this package imports nothing of
clusterkit, so the names are defined on this side)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # not imported at run time: spec.layout is read by the CLI's --help, which imports no pathlib
    from pathlib import Path

JOB_SCRIPT = "job.sbatch"  # render; the retry submits it again
SUPERVISOR_DIR = "supervisor"  # render: this package, copied as it is
LAUNCH_PLAN = "plan.json"  # render: the launch plan
HOSTFILE = "hostfile"  # the supervisor, from the allocation; read by the DeepSpeed launcher and status (host names)
EXIT_CODE = "exit_code"  # the supervisor, when the launch has ended; read by status once SLURM forgot the job
PREFLIGHT_RESULT = (
    "preflight.json"  # preflight, rank 0; read by `clusterkit preflight`, status and a retry (slow nodes)
)
# The runner, rank 0, when it stopped for preemption (the step); the supervisor requeues the job and
# removes it, or adds why not; read by status (a stopped run, to resume).
PREEMPTED_RECORD = "preempted.json"
# Written just before this job is requeued (scontrol requeue): by the supervisor, or by a script of the
# user's that requeues its own job (Lightning's auto-requeue does). This job starts again: the
# supervisor keeps the secrets file for that start and records no outcome. Removed at each start.
REQUEUED = "requeued"
# The supervisor, when it retries a failed run as a new job excluding the failing node: one JSON
# line per retry (job_id, after_job, excluded hosts, node); read by status, which follows the newest,
# and by the retry itself before it takes the run over.
RETRIES = "retries.jsonl"
# The supervisor, each time it starts the launch again on a spare node in the same job: one JSON line
# (restart, job_id, dropped hosts, why, failed_at, restarted_at); read by status.
RESTARTS = "restarts.jsonl"
# Taken (flock) by whoever decides on and records a retry: the supervisor, `clusterkit watch` and
# `clusterkit cancel`; under it retries.jsonl is read, a retry submitted and its line written, so
# a failed job is retried at most once.
RETRY_LOCK = "retries.lock"
# Written by `clusterkit cancel` (for SLURM under RETRY_LOCK, before scancel): no retry starts the run
# again; read by the supervisor's retry, `clusterkit watch` and (the local executor) status.
CANCELLED_MARKER = "cancelled"
RANKS_DIR = "ranks"  # per-node and per-rank records below; created by the node agents and the runner
METRICS = "metrics.jsonl"  # the runner, rank 0, one JSON line per log step; read by --follow, bench and the watchdog
# Touched by a script's ranks at each step (the watchdog's other sign of progress): $CLUSTERKIT_HEARTBEAT.
HEARTBEAT = "heartbeat"
# Below RANKS_DIR: each Python process's stacks, dumped when asked (site/sitecustomize.py, stacks.py).
STACKS_DIR = "ranks/stacks"
# The supervisor, each time it took every rank's stacks (asked by `clusterkit stacks`, or its
# watchdog): the summary and each rank's frames, rewritten whole; read by `clusterkit stacks`.
STACKS_SUMMARY = "ranks/stacks/summary.json"
# Beside the supervisor: the folder put first on the ranks' PYTHONPATH (its sitecustomize registers
# the stack dumps).
SITE_DIR = "site"
# The supervisor's watchdog, when the launch made no progress: when, why, and where each rank was.
HANG_RECORD = "hang.json"
# Below RANKS_DIR: the built-in runner's ranks, each appending one JSON line per optimizer step (its
# step and data-wait times, GPU utilisation where NVML answers); read by status (stragglers.py).
STEP_TIMES_DIR = "ranks/steps"
# Below RANKS_DIR: PyTorch's NCCL flight recorder dumps (GPU profiles), one file per rank, named by
# torch as this prefix plus the rank number; read by people and `clusterkit stacks`.
NCCL_TRACE_DIR = "ranks/nccl-trace"
NCCL_TRACE_PREFIX = f"{NCCL_TRACE_DIR}/rank_"
NCCL_TRACE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # where env.sh points torch at that prefix (spec.network)

# A job of several steps (the recipe's steps:): each step's (and trial's) srun logs below STEPS_DIR,
# and STEPS_RECORD, one JSON line as each run of a step starts and ends (step, trial, job_id, exit
# code); read by status (the failing step) and by a requeued job (the runs it completed are not redone).
STEPS_DIR = "steps"
# launcher: ray: each node's ray start output (<host>.out/.err) and Ray's temp dir and logs (<host>/)
RAY_DIR = "ray"
STEPS_RECORD = "steps.jsonl"

Node = Union[int, str]


def node_dir(node: Node) -> str:
    """``ranks/node<N>``: the node's launcher writes each rank's own output there (torchrun
    --log-dir, DeepSpeed --enable_each_rank_log); read by logs --rank and status. ``node`` is a
    number, or a pattern or run-time value that stands for one (``*``, ``{node_rank}``)."""
    return f"{RANKS_DIR}/node{node}"


def node_exit(node: Node) -> str:
    """``ranks/node<N>.exit``: the node agent's record of when and how the node's program ended;
    read by status and the retry (the earliest failure names the failing node)."""
    return f"{node_dir(node)}.exit"


def node_log(job_id: str, node: Node, stream: str) -> str:
    """``<job id>_<node>_log.out|err``: srun's per-node output (SLURM fills in ``%j``/``%t``); read by
    logs and status (torchrun's root cause)."""
    return f"{job_id}_{node}_log.{stream}"


def step_times(rank: Union[int, str]) -> str:
    """``ranks/steps/rank<R>.jsonl``: rank R's step times (``*`` for every rank's)."""
    return f"{STEP_TIMES_DIR}/rank{rank}.jsonl"


def batch_log(job_id: str, stream: str) -> str:
    """The batch shell's output (sbatch --output, the local executor): node 0's log, shared."""
    return node_log(job_id, 0, stream)


def json_objects(text: str) -> "list[dict]":
    """The JSON objects of a JSON-lines file's text; a line that is none (cut short when its writer
    was killed mid-write) is left out rather than failing the reader."""
    import json

    found = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def step_dir(name: str, trial: "Union[int, str, None]" = None) -> str:
    """``steps/<name>`` (``steps/<name>/<trial>`` for a step's trials): its srun logs, as node_log names them."""
    return f"{STEPS_DIR}/{name}" if trial is None else f"{STEPS_DIR}/{name}/{trial}"


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` under a temporary name, then rename it into place: a reader
    (status, a test polling the run dir, another task of the node) sees no file or the whole file,
    never an empty or half-written one. The temporary name carries the pid, so writers racing on one
    record each rename a whole file of their own."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    os.replace(staging, path)

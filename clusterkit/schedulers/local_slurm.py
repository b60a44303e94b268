"""``srun`` and ``scontrol`` stand-ins for the local executor: just the parts the rendered batch
script uses. ``srun`` starts one process per node with SLURM's per-task variables.

SLURM stops a job's processes wherever they went (its cgroup); here every process of a local job
carries ``CLUSTERKIT_LOCAL_JOB=<run dir>`` in the environment it was started with, and every
process of one ``srun`` step also ``CLUSTERKIT_LOCAL_STEP=<srun pid>``. Both are inherited by every
descendant, including ranks that torchrun puts in sessions of their own, so :func:`terminate`
finds them all, and only them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

JOB_MARKER = "CLUSTERKIT_LOCAL_JOB"
ARRAY_MARKER = "CLUSTERKIT_LOCAL_ARRAY"  # a job array's tasks (and the process that starts them): <array run dir>
STEP_MARKER = "CLUSTERKIT_LOCAL_STEP"
KILL_WAIT_S = 5.0  # SIGTERM, then SIGKILL for what is left after this long (SLURM's KillWait)


def _hosts() -> list[str]:
    return os.environ["SLURM_JOB_NODELIST"].split(",")


def scontrol(argv: list[str]) -> int:
    if argv[:2] != ["show", "hostnames"]:
        print(f"scontrol (clusterkit local executor): only 'show hostnames' is available, not {argv}", file=sys.stderr)
        return 1
    print("\n".join(_hosts()))
    return 0


def _expand(pattern: str, job_id: str, task: int, host: str) -> str:
    array_id, index = os.environ.get("SLURM_ARRAY_JOB_ID", ""), os.environ.get("SLURM_ARRAY_TASK_ID", "")
    return (
        pattern.replace("%j", job_id)
        .replace("%A", array_id)
        .replace("%a", index)
        .replace("%t", str(task))
        .replace("%n", str(task))
        .replace("%N", host)
    )


def srun(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="srun", allow_abbrev=False)
    parser.add_argument("--kill-on-bad-exit", type=int, default=0)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--nodelist")
    parser.add_argument("--ntasks", type=int)
    parser.add_argument("--ntasks-per-node", type=int, default=1)
    parser.add_argument("--open-mode", default="truncate")
    parser.add_argument("--output")
    parser.add_argument("--error")
    parser.add_argument("--cpus-per-task", type=int)
    parser.add_argument("--label", action="store_true")
    parser.add_argument("--wait", type=int, default=0)
    # Placement and MPI wiring: one process per node on one machine has nothing to place or bind.
    for no_effect_here in ("--mpi", "--distribution", "--cpu-bind"):
        parser.add_argument(no_effect_here)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"srun (clusterkit local executor): unsupported options {unknown}", file=sys.stderr)
        return 1
    hosts = args.nodelist.split(",") if args.nodelist else _hosts()
    job_id = os.environ["SLURM_JOB_ID"]
    mode = "ab" if args.open_mode == "append" else "wb"
    batch_shell, step = os.getppid(), str(os.getpid())
    markers = (*job_markers(os.environ.get(JOB_MARKER, "")), f"{STEP_MARKER}={step}")
    children: list[subprocess.Popen[bytes]] = []
    copies: list[threading.Thread] = []
    per_node = args.ntasks_per_node
    tasks = [
        (node * per_node + local, node, local, host) for node, host in enumerate(hosts) for local in range(per_node)
    ]
    for task, node, local, host in tasks[: args.ntasks or len(tasks)]:
        env = dict(
            os.environ,
            SLURM_NODEID=str(node),
            SLURM_PROCID=str(task),
            SLURM_LOCALID=str(local),
            SLURMD_NODENAME=host,
            SLURM_STEP_NUM_TASKS=str(len(tasks)),
            SLURM_NTASKS=str(len(tasks)),
            SLURM_NTASKS_PER_NODE=str(per_node),
            **{STEP_MARKER: step},
        )
        if args.cpus_per_task:
            env["SLURM_CPUS_PER_TASK"] = str(args.cpus_per_task)
        out = open(_expand(args.output, job_id, task, host), mode) if args.output else None
        err = open(_expand(args.error, job_id, task, host), mode) if args.error else None
        pipe = subprocess.PIPE if args.label else None
        child = subprocess.Popen(args.command, env=env, stdout=pipe or out, stderr=pipe or err)
        if args.label:  # as srun --label: each line prefixed with its task number
            for source, sink in ((child.stdout, out or sys.stdout.buffer), (child.stderr, err or sys.stderr.buffer)):
                copies.append(threading.Thread(target=_copy_labelled, args=(source, sink, task), daemon=True))
                copies[-1].start()
        children.append(child)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    first_failure = 0
    first_exit: float | None = None
    while True:
        codes = [child.poll() for child in children]  # every child polled: one failing is noticed
        if None not in codes:
            break
        if first_exit is None and any(code is not None for code in codes):
            first_exit = time.monotonic()
        if args.wait and first_exit is not None and time.monotonic() - first_exit > args.wait:
            terminate(markers)  # --wait: the rest of the step is ended this long after the first task
        failed = [code for code in codes if code not in (None, 0)]
        if failed and not first_failure:
            first_failure = failed[0]
            if args.kill_on_bad_exit:  # SLURM ends the whole step, every node's processes
                terminate(markers)
        if os.getppid() != batch_shell:  # the batch shell was killed: its job ends with it
            terminate(markers)
            return 128 + signal.SIGKILL
        time.sleep(0.2)
    for copy in copies:  # the tasks' last lines, before the step reports its end
        copy.join(timeout=10)
    code = first_failure or next((code for code in codes if code != 0), 0)
    return code if code >= 0 else 128 - code  # killed by signal N → 128+N, as a shell reports it


def _copy_labelled(source: IO[bytes], sink: IO[bytes], task: int) -> None:
    for line in iter(source.readline, b""):
        sink.write(f"{task}: ".encode() + line)
        sink.flush()


def job_markers(run_dir: Path | str) -> tuple[str, ...]:
    return (f"{JOB_MARKER}={run_dir}",)


def carries(pid: int, markers: tuple[str, ...]) -> bool:
    """Whether the process's start environment holds every ``NAME=value`` of ``markers``; an ended
    process (a zombie), or another user's, holds none."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return all(marker.encode() in environ for marker in markers)


def processes_with(markers: tuple[str, ...]) -> list[int]:
    """This machine's processes, other than this one, that carry ``markers``."""
    pids = (int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit())
    return [pid for pid in pids if pid != os.getpid() and carries(pid, markers)]


def terminate(markers: tuple[str, ...], grace_s: float = KILL_WAIT_S) -> None:
    """SIGTERM every process carrying ``markers``, SIGKILL what is left after ``grace_s``, and
    return once they are gone (or, for a process stuck in the kernel, a little later)."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        _signal(processes_with(markers), signum)
        deadline = time.monotonic() + wait_s
        while processes_with(markers) and time.monotonic() < deadline:
            time.sleep(0.1)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main(tool: str, argv: list[str]) -> int:
    return scontrol(argv) if tool == "scontrol" else srun(argv)

"""``srun`` and ``scontrol`` stand-ins for the local executor: just the parts the rendered batch
script uses. ``srun`` starts one process per node with SLURM's per-task variables."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def _hosts() -> list[str]:
    return os.environ["SLURM_JOB_NODELIST"].split(",")


def scontrol(argv: list[str]) -> int:
    if argv[:2] != ["show", "hostnames"]:
        print(f"scontrol (clusterkit local executor): only 'show hostnames' is available, not {argv}", file=sys.stderr)
        return 1
    print("\n".join(_hosts()))
    return 0


def _expand(pattern: str, job_id: str, task: int, host: str) -> str:
    return pattern.replace("%j", job_id).replace("%t", str(task)).replace("%n", str(task)).replace("%N", host)


def srun(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="srun", allow_abbrev=False)
    parser.add_argument("--kill-on-bad-exit", type=int, default=0)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--ntasks", type=int)
    parser.add_argument("--ntasks-per-node", type=int, default=1)
    parser.add_argument("--open-mode", default="truncate")
    parser.add_argument("--output")
    parser.add_argument("--error")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"srun (clusterkit local executor): unsupported options {unknown}", file=sys.stderr)
        return 1
    hosts = _hosts()
    job_id = os.environ["SLURM_JOB_ID"]
    mode = "ab" if args.open_mode == "append" else "wb"
    children: list[subprocess.Popen[bytes]] = []
    for task, host in enumerate(hosts[: args.ntasks or len(hosts)]):
        env = dict(os.environ, SLURM_NODEID=str(task), SLURM_PROCID=str(task), SLURM_LOCALID="0",
                   SLURMD_NODENAME=host, SLURM_STEP_NUM_TASKS=str(len(hosts)))
        out = open(_expand(args.output, job_id, task, host), mode) if args.output else None
        err = open(_expand(args.error, job_id, task, host), mode) if args.error else None
        children.append(subprocess.Popen(args.command, env=env, stdout=out, stderr=err))

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    first_failure = 0
    while any(child.poll() is None for child in children):
        failed = [c.returncode for c in children if c.returncode not in (None, 0)]
        if failed and not first_failure:
            first_failure = failed[0]
            if args.kill_on_bad_exit:
                forward(signal.SIGTERM, None)
        time.sleep(0.2)
    codes = [c.returncode for c in children]
    code = first_failure or next((code for code in codes if code != 0), 0)
    return code if code >= 0 else 128 - code  # killed by signal N → 128+N, as a shell reports it


def main(tool: str, argv: list[str]) -> int:
    return scontrol(argv) if tool == "scontrol" else srun(argv)

"""Commands into a running job: exec (one command on one of its nodes) and shell (an interactive
shell there). Each goes through the adapter that submitted the run: ``srun --overlap`` into the
allocation on SLURM, here or on the login node over SSH; a process of this machine for the local
executor."""

from __future__ import annotations

import argparse
import sys

from clusterkit.cli.common import with_job

# The words argparse's usage line cannot say: the command after "--" (clusterkit.cli.parser.Parser).
_NODE_USAGE = "[--node N | --rank R] [--runs-dir RUNS_DIR] [--accept-new-host-key] JOB"
_LOCAL_NOTE = (
    "With the local executor, every node is this machine: the command runs here, in the run directory, "
    "with the node's SLURM_NODEID and SLURMD_NODENAME (a loopback address) and the job's other variables, "
    "without SLURM's cgroup; cancelling the job ends it too."
)


def cmd_exec(args: argparse.Namespace) -> int:
    from clusterkit.errors import UsageError

    if not args.command_argv:
        raise UsageError(
            f"exec: give the command after --, e.g. clusterkit exec {args.job} -- nvidia-smi"
            if args.command_argv is not None
            else f"exec: put -- before the command, e.g. clusterkit exec {args.job} -- nvidia-smi"
        )
    return _into_job(args, "exec", tuple(args.command_argv), tty=False)


def cmd_shell(args: argparse.Namespace) -> int:
    from clusterkit.errors import UsageError

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            f"shell needs a terminal (its input and output are not one); for one command: "
            f"clusterkit exec {args.job} -- COMMAND"
        )
    return _into_job(args, "shell", ("bash", "-l"), tty=True)


def _into_job(args: argparse.Namespace, what: str, command: tuple[str, ...], tty: bool) -> int:
    """``command`` on the chosen node of the running job ``args.job``; its exit status. A job that
    is not running (pending, ended, unknown) is refused in one line naming its state."""
    from clusterkit import api
    from clusterkit.cli.runs import adapter
    from clusterkit.errors import UsageError
    from clusterkit.runs.node_choice import NodeChoice
    from clusterkit.runs.status import RUNNING

    record = api.find_run(args.job, args.runs_dir, args.accept_new_host_key).record
    if record.tasks:
        raise UsageError(
            f"job {record.job_id} is an array of {len(record.tasks)} tasks, each a job of its own: "
            f"give one, e.g. clusterkit {what} {record.job_id}_{record.tasks[0]}"
        )
    with adapter(record, args) as scheduler:
        status = scheduler.status(record)
        if status.state != RUNNING:
            reason = f" ({status.reason})" if status.reason else ""
            raise UsageError(f"job {record.job_id} is {status.state}{reason}: {what} needs a running job")
        sys.stdout.flush()  # what this process printed comes before the command's own output
        return scheduler.exec(record, NodeChoice(args.node, args.rank), command, tty)


def _where_in_job(p: argparse.ArgumentParser, ranks: bool) -> None:
    with_job(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--node",
        metavar="N",
        help="the node: its index (0-based, as SLURM_NODEID; default 0, the batch host) or its host name",
    )
    if ranks:
        which.add_argument("--rank", type=int, metavar="R", help="the node that runs global rank R")
    else:
        p.set_defaults(rank=None)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "exec",
        help="run a command on one node of a running job, inside its allocation (srun --overlap)",
        usage=f"%(prog)s {_NODE_USAGE} -- CMD [ARGS ...]",
        description="Run CMD (as given, no shell) on one node of a running job, inside the job's allocation "
        "(srun --jobid --overlap, so in its cgroup, beside its ranks): on SLURM here or on the login node over "
        "SSH. Its output is streamed here and its exit status is clusterkit's. " + _LOCAL_NOTE,
    )
    p.after_dashes = "command_argv"
    _where_in_job(p, ranks=True)
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser(
        "shell",
        help="an interactive shell on one node of a running job (srun --overlap --pty bash -l)",
        description="An interactive login shell (bash -l) on one node of a running job, inside its allocation "
        "(srun --jobid --overlap --pty). Over SSH it needs the openssh transport (a terminal on the login node). "
        + _LOCAL_NOTE,
    )
    _where_in_job(p, ranks=False)
    p.set_defaults(func=cmd_shell)

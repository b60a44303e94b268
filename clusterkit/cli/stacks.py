"""``clusterkit stacks``: every rank's Python stacks of a running job, summarised."""

from __future__ import annotations

import argparse

from clusterkit.cli.common import print_json, whole_number, with_job, with_json


def cmd_stacks(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.runs.stacks import narrowed, text_lines

    run = api.find_run(args.job, args.runs_dir, args.accept_new_host_key)
    summary = narrowed(run.stacks(timeout_s=args.timeout), args.rank, args.node)
    if args.json:
        print_json({"job_id": run.job_id, **summary})
    else:
        for line in text_lines(run.job_id, summary):
            print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="every rank's Python stacks of a running job, grouped by where they are",
        description="Asks the job's supervisor to take every rank's Python stacks (all threads) inside the "
        "allocation, and prints a summary (ranks grouped by their innermost frame, the odd ones named with their "
        "node) and each process's frames. The ranks need not cooperate: every Python process of the job has "
        "faulthandler registered on SIGWINCH. The job goes on unharmed.",
    )
    with_job(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="R", help="only this global rank's processes")
    which.add_argument("--node", metavar="N", help="only this node's processes (its index or host name)")
    p.add_argument(
        "--timeout",
        type=whole_number(3600),
        default=30,
        metavar="S",
        help="how long to wait for the answer (default 30)",
    )
    with_json(p)
    p.set_defaults(func=cmd_stacks)

"""Commands about this node: doctor."""

from __future__ import annotations

import argparse
import json


def cmd_doctor(args: argparse.Namespace) -> int:
    from clusterkit.diagnose.doctor import FAIL, diagnose, print_report, to_json
    from clusterkit.diagnose.host_facts import gather

    checks = diagnose(gather(in_job=args.in_job, dataloader_workers=args.dataloader_workers))
    if args.json:
        print(json.dumps(to_json(checks), indent=2))
    else:
        print_report(checks)
    return 1 if any(check.verdict == FAIL for check in checks) else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="check this node: torch/CUDA/NCCL, GPUs and their links, RAM, /dev/shm, network env"
    )
    p.add_argument(
        "--in-job", action="store_true", help="inside an allocation: compare what torch sees with what SLURM allocated"
    )
    p.add_argument(
        "--dataloader-workers", type=int, default=2, metavar="N", help="per rank, for the /dev/shm check (default 2)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)

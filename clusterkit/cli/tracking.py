"""``clusterkit sync``: upload a run tracked offline (clusterkit.runs.tracking_sync says what
each tracker allows)."""

from __future__ import annotations

import argparse
import shlex

from clusterkit.cli.common import with_job


def cmd_sync(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.runs.tracking_sync import run_sync, sync_argv

    record = api.find_run(args.job, args.runs_dir, args.accept_new_host_key).record
    argv = sync_argv(record, args.dry_run)
    print(f"clusterkit: {shlex.join(argv)}", flush=True)
    run_sync(argv)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sync", help="upload a run tracked offline (tracking.offline) with the tracker's own sync")
    with_job(p)
    p.add_argument("--dry-run", action="store_true", help="ask the tracker what it would upload (wandb sync --dry-run)")
    p.set_defaults(func=cmd_sync)

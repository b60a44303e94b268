"""``clusterkit gpus [RECIPE]``: the cluster's partitions, their GPUs and nodes, free and in all,
from one ``sinfo`` (:mod:`clusterkit.schedulers.slurm_partitions`); with a recipe, where its job
could start now, and where never. On this machine's SLURM, or the profile's login node over SSH.
Also ``submit --test-only`` (SLURM's start estimate for the rendered job, and the partition's verdict).

Exit codes: 0 the table (the estimate); 1 SLURM could not be asked; 2 a recipe, profile or option is
wrong, or (--test-only) SLURM would never run the job as it is."""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager

from clusterkit.cli.common import print_columns, print_json, with_host_keys, with_json, with_overrides


def cluster_host(profile, accept_new_host_key: bool = False, name: str | None = None) -> AbstractContextManager:
    """The adapter of the profile's cluster (its ``host`` runs SLURM's commands): ``name``'s (a
    request's executor), by default SLURM here or the login node over SSH; refused where there is neither."""
    from clusterkit.errors import UsageError
    from clusterkit.schedulers.api import default_scheduler, open_scheduler

    name = name or default_scheduler(profile)
    if name == "local":
        raise UsageError(
            f"no SLURM on this machine (sbatch is not on PATH) and cluster profile {profile.name!r} "
            "names no login node (login: {host: ...}): nothing to ask"
        )
    return open_scheduler(name, profile.login if name == "ssh" else None, accept_new_host_key)


def _cell(value: object) -> str:
    from clusterkit.errors import printable

    return printable(str(value))


def partition_rows(found) -> list[tuple[str, ...]]:
    rows = [
        (
            "PARTITION",
            "GPU",
            "GPUS/NODE",
            "GPUS FREE/ALL",
            "NODES FREE/ALL",
            "IDLE",
            "MIXED",
            "ALLOC",
            "DRAIN/DOWN",
            "TIME LIMIT",
        )
    ]
    for partition in found:
        shown = partition.to_json()
        kinds = ",".join(kind or "gpu" for kind in partition.gpu_types) or "-"
        per_node = partition.gpus_per_node
        rows.append(
            tuple(
                map(
                    _cell,
                    (
                        f"{partition.name}{'*' if partition.default else ''}",
                        kinds,
                        str(per_node[0]) if len(per_node) == 1 else f"{per_node[0]}-{per_node[-1]}",
                        f"{shown['gpus_free']}/{shown['gpus_total']}",
                        f"{shown['nodes_free']}/{shown['nodes_total']}",
                        shown["nodes_idle"],
                        shown["nodes_mixed"],
                        shown["nodes_allocated"],
                        shown["nodes_unavailable"],
                        partition.time_limit,
                    ),
                )
            )
        )
    return rows


def _loaded(args: argparse.Namespace):
    """The recipe with its overrides and --cluster, or None; and the profile asked."""
    from pathlib import Path

    from clusterkit.load.loader import cluster_override, load_profile, load_recipe
    from clusterkit.load.user_config import load_user_config

    if args.recipe:
        loaded = load_recipe(
            args.recipe, [*(args.set or ()), *([cluster_override(args.cluster)] if args.cluster else [])]
        )
        return loaded, loaded.profile
    if args.set:
        from clusterkit.errors import UsageError

        raise UsageError("--set changes a recipe: give the RECIPE too")
    reference = args.cluster or load_user_config().config.cluster or "dev"
    return None, load_profile(reference, Path.cwd())[0]


def cmd_gpus(args: argparse.Namespace) -> int:
    from clusterkit.schedulers.slurm_partitions import asked_of, chosen_partition, fits, read_partitions

    loaded, profile = _loaded(args)
    with cluster_host(profile, args.accept_new_host_key) as scheduler:
        found = read_partitions(scheduler.host)
    if loaded is None:
        if args.json:
            print_json({"cluster": profile.name, "partitions": [p.to_json() for p in found], "recipe": None})
        else:
            print_columns(partition_rows(found))
            if profile.partition and all(partition.name != profile.partition for partition in found):
                print(_cell(f"cluster profile {profile.name}'s partition {profile.partition} is not among them"))
        return 0
    asked = asked_of(loaded.recipe, profile)
    verdicts = fits(found, asked)
    own = chosen_partition(found, loaded.recipe.resources.partition)
    if args.json:
        print_json(
            {
                "cluster": profile.name,
                "partitions": [p.to_json() for p in found],
                "recipe": {
                    "name": loaded.recipe.name,
                    "partition": own.name if own else loaded.recipe.resources.partition,
                    "nodes": asked.nodes,
                    "gpus_per_node": asked.gpus_per_node,
                    "time": asked.time,
                    "fits": [verdict.to_json() for verdict in verdicts],
                },
            }
        )
        return 0
    print_columns(partition_rows(found))
    print()
    print(_cell(f"{loaded.recipe.name}: {asked.words}, time {asked.time or 'the partition default'}"))
    words = {"now": "could start now", "later": "must wait", "never": "NEVER"}
    for verdict in verdicts:
        mark = " (the recipe's)" if own is not None and verdict.partition == own.name else ""
        print(_cell(f"  {verdict.partition}{mark}: {words[verdict.verdict]}: {verdict.why}"))
    if own is None:
        named = loaded.recipe.resources.partition
        print(_cell(f"  the recipe's partition {named!r} is not among them" if named else "  no default partition"))
    return 0


def test_only(prepared, args: argparse.Namespace) -> int:
    """``submit --test-only``: SLURM's start estimate for exactly this job, and the partition's
    verdict from sinfo (a time over its limit is never, though sbatch may not say so)."""
    from clusterkit.errors import SchedulerError, UsageError, printable
    from clusterkit.schedulers.slurm_partitions import asked_of, chosen_partition, fit, read_partitions
    from clusterkit.schedulers.slurm_test_only import NeverRuns, estimate_start

    request, loaded = prepared.request, prepared.loaded
    if args.dry_run or args.follow:
        raise UsageError("--test-only queues nothing: it goes without --dry-run and --follow")
    if request.scheduler == "local":
        raise UsageError("--test-only asks SLURM when the job would start; the local executor has no queue")
    asked = asked_of(loaded.recipe, loaded.profile)

    def verdict_in(host, partition: str | None):
        """sinfo's verdict on the job in that partition; None where sinfo does not tell (sbatch's answer stands)."""
        try:
            found = chosen_partition(read_partitions(host), partition)
        except SchedulerError:
            return None
        verdict = fit(found, asked) if found else None
        if verdict is not None and verdict.verdict == "never":
            raise NeverRuns(
                printable(f"SLURM would never run this job in partition {verdict.partition}: {verdict.why}")
            )
        return verdict

    with cluster_host(loaded.profile, args.accept_new_host_key, request.scheduler) as scheduler:
        try:
            estimate = estimate_start(scheduler.host, request)
        except NeverRuns:
            verdict_in(scheduler.host, loaded.recipe.resources.partition)  # its words are the more precise
            raise
        verdict = verdict_in(scheduler.host, estimate.partition)
    if args.json:
        print_json({"estimate": estimate.to_json(), "partition": verdict.to_json() if verdict else None})
        return 0
    print(
        printable(
            f"job would start at {estimate.start} on {estimate.nodes} ({estimate.processors} processors, "
            f"partition {estimate.partition}); nothing was queued"
        )
    )
    if verdict is not None:
        print(printable(f"partition {verdict.partition}: {verdict.why}"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpus",
        help="the cluster's partitions: GPU types, free and total GPUs and nodes, time limits; "
        "with a RECIPE, where its job could start now and where never",
    )
    p.add_argument("recipe", nargs="?", metavar="RECIPE", help="a recipe: where could its job run?")
    p.add_argument(
        "--cluster",
        metavar="PROFILE",
        help="the cluster profile to ask (default: the recipe's, else the user config's cluster, else dev)",
    )
    with_overrides(p)
    with_json(p)
    with_host_keys(p)
    p.set_defaults(func=cmd_gpus)

"""Commands that submit: submit, preflight, bench. The orchestration is the launch layer's
(:mod:`clusterkit.launch.prepare`); the adapters are the schedulers'; this module parses and prints."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from clusterkit.cli.common import (
    EXIT_USAGE,
    code_words,
    int_list,
    print_json,
    record_json,
    status_json,
    submit_choices,
    submit_options,
    whole_number,
    with_host_keys,
    with_json,
    with_local_target,
    with_overrides,
    with_program_args,
)
from clusterkit.spec.layout import METRICS, PREFLIGHT_RESULT


def _prepare(args: argparse.Namespace, extra=(), one_job: str | None = None):
    from clusterkit import api

    prepared = api.prepare(args.recipe, args.set, args.cluster, submit_choices(args), extra, one_job)
    for line in [*prepared.notes, *map(str, prepared.loaded.warnings)]:
        print(line, file=sys.stderr)
    return prepared


def _shown_workdir(workdir: str) -> str:
    """remote_workdir as the login node's shell would read it: quoted, but for the home it starts from."""
    if workdir == "~" or not workdir.startswith("~/"):
        return workdir if workdir == "~" else shlex.quote(workdir)
    return "~/" + shlex.quote(workdir.removeprefix("~/"))


def _print_submitted(record) -> None:
    where = f"{record.login['host']}:{record.run_dir}" if record.scheduler == "ssh" else record.run_dir
    print(f"submitted job {record.job_id} to cluster {record.cluster} ({executor_words(record)})")
    print(f"run dir: {where}")
    if record.code_from:
        from clusterkit.errors import printable

        print(printable(f"code:    {code_words(record)}"))
    print(f"follow:  clusterkit logs {record.job_id} -f   |   clusterkit status {record.job_id}")


def executor_words(record) -> str:
    """Which executor sent the run where: "slurm executor", "ssh executor, login node X"."""
    return f"{record.scheduler} executor" + (f", login node {record.login['host']}" if record.login else "")


def request_json(request) -> dict:
    """``submit --dry-run --json``: the exact request, as it would be sent."""
    return {
        "scheduler": request.scheduler,
        "argv": list(request.argv),
        "script": request.script_name,
        "files": dict(request.files),
        "runs_root": request.runs_root,
        "login_host": request.login.host if request.login else None,
        "snapshot": None
        if request.snapshot is None
        else {
            "from": request.snapshot.root,
            "commit": request.snapshot.commit,
            "dirty": request.snapshot.dirty,
            "files": list(request.snapshot.files),
            "bytes": request.snapshot.size,
            "left_out": list(request.snapshot.left_out),
        },
    }


def plan_lines(files) -> list[str]:
    """What the job's supervisor will run, step by step (from the request's plan.json; a sweep's
    points each have their own): the program of each task, its run-time values unfilled."""
    from clusterkit.spec.layout import LAUNCH_PLAN
    from clusterkit.supervisor.plan import load_plan

    if LAUNCH_PLAN not in files:
        return []
    plan = load_plan(files[LAUNCH_PLAN])
    # A job of several steps runs them (in order) instead of the launch.
    steps = [
        plan.image_check,
        plan.service.step if plan.service else None,
        *(component.step for component in plan.components),
        plan.ray.head if plan.ray else None,  # launcher: ray: its cluster, then the driver (the launch)
        plan.ray.workers if plan.ray else None,
        plan.preflight,
        *(plan.steps or [plan.launch]),
    ]
    return [
        f"# {step.name}: {step.nodes} x {step.tasks_per_node} task(s) per node"
        + (f", {step.repeat} trials" if step.repeat > 1 else "")
        + (" in the batch shell" if step.hosts == "batch" else "")
        + (f" in het group {step.het_group}" if step.het_group is not None else "")
        + f": {shlex.join(step.argv)}"
        for step in steps
        if step is not None
    ]


def cmd_submit(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.errors import printable
    from clusterkit.load.loader import Override
    from clusterkit.schedulers.api import open_scheduler

    prepared = _prepare(args, [Override(("snapshot",), False)] if args.no_snapshot else [])
    request = prepared.request
    if getattr(args, "test_only", False):  # submit's; sweep shares this command
        from clusterkit.cli.gpus import test_only

        return test_only(prepared, args)
    if args.dry_run:
        if args.json:
            print_json(request_json(request))
            return 0
        where = f" (in {_shown_workdir(request.login.remote_workdir)} on {request.login.host})" if request.login else ""
        print(printable(f"# would run: {shlex.join(request.argv)}{where}"), file=sys.stderr)
        print(f"# on cluster {request.cluster} with the {request.scheduler} executor", file=sys.stderr)
        if request.snapshot:
            print(f"# code snapshot into the run directory's code/: {request.snapshot.describe()}", file=sys.stderr)
        for line in plan_lines(request.files):
            print(printable(line), file=sys.stderr)
        sys.stdout.write(request.script)
        return 0
    # One adapter (one SSH connection) for submitting and following.
    with open_scheduler(request.scheduler, request.login, args.accept_new_host_key) as scheduler:
        record = scheduler.submit(request)
        if args.json:  # no progress display: the record, and with --follow the final status once ended
            final = api.Run(record, args.accept_new_host_key).wait() if args.follow else None
            print_json({"run": record_json(record), "status": None if final is None else status_json(final)})
            return 0 if final is None or final.state == "COMPLETED" else 1
        _print_submitted(record)
        if not args.follow:
            return 0
        from clusterkit.runs.follow import follow
        from clusterkit.runs.status import COMPLETED

        if record.tasks:
            return _follow_array(record, scheduler)
        final = follow(record, scheduler.status, scheduler.run_file(record, METRICS))
        return 0 if final.state == COMPLETED else 1


def _follow_array(record, scheduler) -> int:
    """Until every task of the array has ended: a line whenever the counts change, then the table."""
    from clusterkit.cli.runs import array_results, print_results
    from clusterkit.runs.poll import poll
    from clusterkit.runs.status import COMPLETED

    said = None
    for status in poll(lambda: scheduler.status(record), lambda status: status.done):
        if status.reason != said:
            print(f"job {record.job_id}: {status.reason}", flush=True)
            said = status.reason
    print_results(record, array_results(record, scheduler)[1])
    return 0 if status.state == COMPLETED else 1


def cmd_preflight(args: argparse.Namespace) -> int:
    """Submit only the preflight benchmark of a recipe's layout, wait for it and print its results."""
    from clusterkit import api
    from clusterkit.errors import UsageError
    from clusterkit.load.loader import Override
    from clusterkit.runs.follow import follow
    from clusterkit.runs.preflight_report import format_report
    from clusterkit.runs.status import COMPLETED
    from clusterkit.schedulers.api import open_scheduler
    from clusterkit.spec.bounded_read import CONFIG_LIMIT, read_bounded

    request = _prepare(
        args, (Override(("preflight", "enabled"), True), Override(("preflight", "only"), True)), one_job="preflight"
    ).request
    if request.scheduler == "ssh":
        raise UsageError(
            "clusterkit preflight runs where sbatch is (or locally); over SSH, submit the recipe "
            "with preflight: {enabled: true, only: true}"
        )
    with open_scheduler(request.scheduler) as scheduler:
        record = scheduler.submit(request)
        if args.json:
            final = api.Run(record).wait()
        else:
            _print_submitted(record)
            final = follow(record, scheduler.status, scheduler.run_file(record, METRICS))
    result_file = record.path / PREFLIGHT_RESULT
    result = (
        json.loads(read_bounded(result_file, CONFIG_LIMIT, "a preflight result")) if result_file.is_file() else None
    )
    if args.json:
        print_json({"run": record_json(record), "status": status_json(final), "result": result})
    elif result is not None:
        print(format_report(result))
        print(f"results: {result_file}")
    return 0 if final.state == COMPLETED else 1


def cmd_bench(args: argparse.Namespace) -> int:
    import datetime
    from pathlib import Path

    from clusterkit.diagnose.bench import read_result, run_scales, table_rows, with_scaling, write_outputs

    warmup = args.warmup if args.warmup is not None else min(max(1, args.steps // 5), args.steps - 1)
    if not 0 <= warmup < args.steps:
        print(
            f"clusterkit bench: --warmup {warmup}: give 0 to {args.steps - 1} (fewer than --steps {args.steps})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    progress = (lambda line: print(line, file=sys.stderr)) if args.json else print  # stdout: the JSON only
    submitted = run_scales(submit_options(args), args.nodes, args.gpus_per_node, args.steps, report=progress)
    base = submitted.records[0]
    results = with_scaling(
        [
            read_result(scale, record, submitted.states[record.job_id], warmup)
            for scale, record in zip(submitted.scales, submitted.records)
        ]
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.output) if args.output else Path(base.run_dir).parent / f"bench-{stamp}"
    meta = {
        "name": base.name,
        "recipe": str(submitted.recipe_path),
        "steps": args.steps,
        "warmup_steps": warmup,
        "submitted_as": submitted.how,
    }
    written = write_outputs(results, out_dir, meta)
    ok = all(state == "COMPLETED" for state in submitted.states.values())
    if args.json:  # bench.json's content, and where it and the plot were written
        print_json({**json.loads(written[0].read_text()), "outputs": [str(path) for path in written]})
        return 0 if ok else 1
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(
        "GPUs",
        "nodes x GPUs",
        "samples/s",
        "speedup",
        "efficiency",
        "comm share",
        "state",
        title=Text(f"{base.name}: {args.steps} steps per scale, first {warmup} excluded"),
    )
    for row in table_rows(results):
        table.add_row(*map(Text, row))  # text, not rich markup: the recipe's name, the scheduler's states
    Console().print(table)
    print("comm share: n/a: DDP overlaps its all-reduces with the backward pass, so the runner cannot time them apart")
    for path in written:
        print(f"wrote {path}")
    return 0 if ok else 1


def _where_to_submit(p: argparse.ArgumentParser) -> None:
    """submit's and sweep's: where the job goes, which templates, which values."""
    p.add_argument(
        "--executor",
        choices=("slurm", "local", "ssh"),
        help="default: ssh if the cluster profile names a login node other than this host, else slurm if "
        "sbatch is on PATH, else local",
    )
    p.add_argument(
        "--cluster", metavar="PROFILE", help="the cluster profile to run on (name or file), instead of the recipe's"
    )
    p.add_argument("--template-dir", action="append", metavar="DIR", help="look up templates here first")
    p.add_argument(
        "--no-snapshot",
        action="store_true",
        help="run the script where it is when the job starts, not a copy taken now (as snapshot: false)",
    )
    with_overrides(p)
    with_host_keys(p)
    with_program_args(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="validate, render and submit (SLURM where sbatch exists, else local)")
    p.add_argument("recipe", metavar="RECIPE", nargs="?")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an earlier run from its newest checkpoint (its recipe, unless RECIPE is given)",
    )
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="with --resume: run it again from step 0 (without it, a run with no complete checkpoint is refused)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the exact batch script that would be submitted")
    p.add_argument(
        "--test-only",
        action="store_true",
        help="ask SLURM (sbatch --test-only) when and where the job would start; queues nothing. "
        "Exit 2: SLURM would never run it as it is (the line says what to change)",
    )
    p.add_argument("--follow", action="store_true", help="stream progress until the job ends; exit 1 if it failed")
    with_json(p)
    p.add_argument(
        "--after",
        action="append",
        metavar="JOB[,JOB]",
        help="start only after these jobs (ids, array tasks 123_4, or run directories) ended as --after-type says",
    )
    p.add_argument(
        "--after-type",
        choices=("afterok", "afterany", "afternotok"),
        default="afterok",
        help="afterok (default): they succeeded; afterany: they ended; afternotok: they failed",
    )
    p.add_argument(
        "--singleton", action="store_true", help="one job of this name (and user) at a time (SLURM singleton)"
    )
    p.add_argument(
        "--chain",
        type=whole_number(1000),
        metavar="N",
        help="N links one after another (a job array run one task at a time) continuing one run in one "
        "run directory, each from the newest complete checkpoint: for runs longer than the time limit",
    )
    _where_to_submit(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "sweep", help="run every point of a grid as one SLURM job array (validated first); --follow prints the results"
    )
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY.PATH=V1,V2,...",
        help="the values of one recipe key (YAML each, as --set); repeatable: every combination is a point. "
        "Adds to (or replaces a key of) the recipe's sweep: block",
    )
    p.add_argument(
        "--max-parallel", type=whole_number(100_000), metavar="N", help="at most N points at once (the array's %%N)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the array's script (each point's own is in its render)"
    )
    p.add_argument(
        "--follow", action="store_true", help="wait for every point, then print the results; exit 1 if one failed"
    )
    with_json(p)
    _where_to_submit(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser(
        "preflight",
        help="run only the all-reduce preflight on a recipe's layout; print bus bandwidth per size and node",
    )
    p.add_argument("recipe", metavar="RECIPE")
    with_json(p)
    with_local_target(p)
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser(
        "bench", help="run a recipe at several scales; samples/s, speedup and scaling efficiency (table, JSON, PNG)"
    )
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--nodes", type=int_list, required=True, metavar="N,N,...", help="node counts, e.g. 1,2,4")
    p.add_argument(
        "--gpus-per-node", type=int_list, metavar="G,G,...", help="GPUs per node to try (default the recipe's)"
    )
    p.add_argument(
        "--steps", type=whole_number(1_000_000_000), default=20, help="training steps per scale (default 20)"
    )
    p.add_argument("--warmup", type=int, metavar="STEPS", help="steps left out of the measurement (default steps/5)")
    p.add_argument("-o", "--output", metavar="DIR", help="where bench.json and bench.png go (default beside the runs)")
    with_json(p)
    with_local_target(p)
    p.set_defaults(func=cmd_bench)

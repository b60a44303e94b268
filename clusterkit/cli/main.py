"""The ``clusterkit`` command line.

render/validate/schema import nothing heavy (no torch, transformers, deepspeed, paramiko, submitit):
they must start fast on a login node. Commands that talk to SLURM import their modules lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from clusterkit.errors import (ClusterkitError, FileSystemError, LocatedError, PathError, RecipeError, UsageError,
                               UserError, is_users_path_error, printable)
from clusterkit.runs.layout import EXPORT_DIR, METRICS, PREFLIGHT_RESULT

EXIT_USAGE = 2  # a user error: the input, an argument or a chosen path is wrong
EXIT_FAILURE = 1  # an external failure: the scheduler, the login node or this machine
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
TEMPLATES_ENV = "CLUSTERKIT_TEMPLATES"  # colon-separated ops template directories
DEFAULT_RUNS_DIR = "./runs"


def _recipe_files(paths: Sequence[str]) -> tuple[list[Path], int]:
    """Recipe paths, expanding directories to the recipes inside (ops teams lint whole folders),
    and how many base files (extended by a recipe there, no recipe alone) a folder held."""
    from clusterkit.load.loader import base_recipes

    files: list[Path] = []
    skipped = 0
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.y*ml") if "clusters" not in p.relative_to(path).parts)
            bases = base_recipes(found)
            files.extend(p for p in found if p not in bases)
            skipped += len(bases)
        else:
            files.append(path)
    return files, skipped


def _template_dirs(args: argparse.Namespace) -> tuple[str, ...]:
    """The template directories before the recipe's own and the built-ins, first match wins:
    ``--template-dir`` (repeatable), then $CLUSTERKIT_TEMPLATES. Read here: rendering is pure."""
    from_env = [d for d in os.environ.get(TEMPLATES_ENV, "").split(os.pathsep) if d]
    return (*(args.template_dir or ()), *from_env)


def _print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def cmd_validate(args: argparse.Namespace) -> int:
    from clusterkit.load.loader import load_recipe

    failed = 0
    files, bases_skipped = _recipe_files(args.recipes)
    for path in files:
        try:
            loaded = load_recipe(path, args.set or ())
        except RecipeError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        for warning in loaded.warnings:
            print(warning, file=sys.stderr)
        if not args.quiet:
            print(f"{path}: ok")
    if (len(files) > 1 or bases_skipped) and not args.quiet:
        skipped = f" ({bases_skipped} base file{'s' if bases_skipped != 1 else ''} skipped)" if bases_skipped else ""
        print(f"{len(files) - failed} of {len(files)} recipes valid{skipped}")
    return EXIT_USAGE if failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    from clusterkit.load.loader import load_recipe
    from clusterkit import __version__
    from clusterkit.render.job import render_job
    from clusterkit.render.output_dir import write_render

    loaded = load_recipe(args.recipe, args.set or ())
    job = render_job(loaded, _template_dirs(args))
    out_dir = write_render(job.files, Path(args.output or f"render/{job.name}"),
                           f"clusterkit {__version__} render of {loaded.path}")
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    _print_table(job.summary)
    print(f"wrote {', '.join(job.files)} to {out_dir}/")
    return 0


def _cluster_override(reference: str) -> str:
    """``--cluster X`` as a ``cluster=`` override; a path is taken relative to here, not the recipe."""
    if "/" in reference or reference.endswith((".yaml", ".yml")):
        from clusterkit.spec.profile import expanded

        reference = str(expanded(reference).absolute())
    return f"cluster={json.dumps(reference)}"


def _prepare_submission(args: argparse.Namespace, extra_overrides: Sequence[str] = ()):
    """The recipe loaded with every override (--resume, --set, --cluster) and its dry-run request."""
    from clusterkit.load.loader import load_recipe
    from clusterkit.render.job import render_job
    from clusterkit.schedulers.api import dry_run

    recipe, overrides = args.recipe, list(args.set or ())
    if getattr(args, "resume", None):
        from clusterkit.runs.record import read_record

        earlier = read_record(Path(args.resume))
        # The earlier run's recipe and --set values, then this command's, then where to resume from
        # (for a run submitted over SSH: its run directory on the cluster, and over SSH again).
        recipe = recipe or earlier.recipe
        resume_from = earlier.run_dir if earlier.scheduler == "ssh" else Path(args.resume).absolute()
        overrides = [*earlier.overrides, *overrides]
        if args.from_scratch:
            print(f"clusterkit: --from-scratch: running {printable(args.resume)} again from step 0 "
                  "(its checkpoints are not used)", file=sys.stderr)
        else:
            if earlier.scheduler != "ssh":  # an SSH run's checkpoints are on the cluster: the job checks there
                from clusterkit.runs.checkpoint_files import checkpoints_dir, newest_usable

                found, damaged = newest_usable(checkpoints_dir(Path(args.resume)))
                if found is None:
                    why = f"its complete checkpoints are damaged ({damaged[0][1]})" if damaged else "no complete checkpoint"
                    raise UsageError(f"{args.resume}: nothing to resume: {why}; "
                                     "add --from-scratch to run it again from step 0")
            overrides.append(f"resume_from={resume_from}")
        if earlier.scheduler == "ssh":
            args.executor = args.executor or "ssh"
    elif getattr(args, "from_scratch", False):
        raise UsageError("--from-scratch goes with --resume RUN_DIR")
    if recipe is None:
        raise UsageError("give a RECIPE, or --resume RUN_DIR")
    if args.cluster:
        overrides.append(_cluster_override(args.cluster))
    loaded = load_recipe(recipe, [*overrides, *extra_overrides])
    request = dry_run(loaded, render_job(loaded, _template_dirs(args)), args.executor)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    return loaded, request


def cmd_submit(args: argparse.Namespace) -> int:
    from clusterkit.schedulers.api import schedule

    if args.bundle:
        return _submit_bundle(Path(args.bundle))
    _, request = _prepare_submission(args)
    if args.dry_run:
        print(f"# would run: {' '.join(request.argv)}", file=sys.stderr)
        sys.stdout.write(request.script)
        return 0
    if request.scheduler == "ssh":
        return _submit_over_ssh(request, args)
    record = schedule(request)
    _print_submitted(record, request.scheduler, record.run_dir)
    if args.follow:
        from clusterkit.runs.follow import follow
        from clusterkit.runs.status import COMPLETED

        return 0 if follow(record).state == COMPLETED else 1
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """Submit only the preflight benchmark of a recipe's layout, wait for it and print its results."""
    from clusterkit.runs.follow import follow
    from clusterkit.runs.status import COMPLETED
    from clusterkit.diagnose.preflight_report import format_report
    from clusterkit.schedulers.api import schedule

    _, request = _prepare_submission(args, ("preflight.enabled=true", "preflight.only=true"))
    if request.scheduler == "ssh":
        raise UsageError("clusterkit preflight runs where sbatch is (or locally); over SSH, submit the recipe "
                         "with preflight: {enabled: true, only: true}")
    record = schedule(request)
    _print_submitted(record, request.scheduler, record.run_dir)
    final = follow(record)
    result_file = record.path / PREFLIGHT_RESULT
    if result_file.is_file():
        print(format_report(json.loads(result_file.read_text())))
        print(f"results: {result_file}")
    return 0 if final.state == COMPLETED else 1


def _print_submitted(record, scheduler: str, where: str) -> None:
    print(f"submitted job {record.job_id} ({scheduler} executor)")
    print(f"run dir: {where}")
    print(f"follow:  clusterkit logs {record.job_id} -f   |   clusterkit status {record.job_id}")


def _submit_over_ssh(request, args: argparse.Namespace) -> int:
    """One connection for upload, submission and following."""
    from clusterkit.schedulers.ssh_transport import connect
    from clusterkit.schedulers.ssh import LoginNode, RemoteFile, submit

    with connect(request.login, args.accept_new_host_key) as session:
        node = LoginNode(session, request.login)
        record = submit(request, node)
        _print_submitted(record, "ssh", _where(record))
        if not args.follow:
            return 0
        from clusterkit.runs.follow import follow
        from clusterkit.runs.status import COMPLETED

        final = follow(record, status_of=node.status, metrics=RemoteFile(session, f"{record.run_dir}/{METRICS}"))
        return 0 if final.state == COMPLETED else 1


def _submit_bundle(bundle: Path) -> int:
    """On a login node, for a remote clusterkit: submit an uploaded bundle as a local submit would,
    then print the run record as one JSON line."""
    import dataclasses
    import shutil

    from clusterkit.schedulers.ssh import request_from_bundle
    from clusterkit.schedulers.api import schedule

    record = schedule(request_from_bundle(bundle))
    shutil.rmtree(bundle, ignore_errors=True)
    print(json.dumps(dataclasses.asdict(record)))
    return 0


def _runs_dir(args: argparse.Namespace) -> Path:
    return Path(args.runs_dir)


def _find(args: argparse.Namespace):
    from clusterkit.runs.record import find_run

    return find_run(args.job, _runs_dir(args))


def _statuses(records: list, accept_new_host_key: bool = False, unreachable_ok: bool = False) -> list:
    """Each record's status; runs on a login node are asked over one connection per login node."""
    from clusterkit.runs.status import job_status

    remote = [record for record in records if record.scheduler == "ssh"]
    found = {}
    if remote:
        from clusterkit.schedulers.ssh import remote_statuses

        found = remote_statuses(remote, accept_new_host_key, unreachable_ok)
    return [found[id(record)] if record.scheduler == "ssh" else job_status(record) for record in records]


def _where(record) -> str:
    return f"{record.login['host']}:{record.run_dir}" if record.scheduler == "ssh" else record.run_dir


def cmd_status(args: argparse.Namespace) -> int:
    import dataclasses

    from clusterkit.runs.record import list_runs

    records = [_find(args)] if args.job else list_runs(_runs_dir(args))[: args.limit]
    statuses = _statuses(records, args.accept_new_host_key, unreachable_ok=not args.job)
    if args.json:
        as_json = [dataclasses.asdict(status) for status in statuses]
        print(json.dumps(as_json[0] if args.job else [
            {"job_id": r.job_id, "name": r.name, "run_dir": _where(r), **s} for r, s in zip(records, as_json)]))
        return 0
    if not records:
        print(f"no runs under {_runs_dir(args)}")
        return 0
    for record, status in zip(records, statuses):
        line = f"{record.job_id}  {record.name}  {status.state}"
        if status.exit_code is not None:
            line += f"  exit {status.exit_code}"
        if status.reason:
            line += f"  ({status.reason})"
        print(line)
        if args.job:
            print(f"  run dir: {_where(record)}")
            print(f"  layout:  {record.nodes} nodes x {record.ranks_per_node} ranks, {record.launcher}, {record.scheduler} executor")
        if status.failure:
            print(f"  first failure: {status.failure}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    import datetime

    from clusterkit.runs.record import list_runs

    if args.cluster:
        return _ls_on_login_node(args)
    records = list_runs(_runs_dir(args))[: args.limit]
    if not records:
        print(f"no runs under {_runs_dir(args)}")
        return 0
    rows = [("JOB", "NAME", "STATE", "SUBMITTED", "LAYOUT", "RUN DIR")]
    for record, status in zip(records, _statuses(records, args.accept_new_host_key, unreachable_ok=True)):
        when = datetime.datetime.fromtimestamp(record.submitted_at).strftime("%Y-%m-%d %H:%M")
        rows.append((record.job_id, record.name, status.state, when,
                     f"{record.nodes}x{record.ranks_per_node} {record.launcher}", _where(record)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _ls_on_login_node(args: argparse.Namespace) -> int:
    """``ls --cluster``: the runs on the cluster itself, as its own clusterkit lists them."""
    from clusterkit.load.loader import load_profile
    from clusterkit.schedulers.ssh_transport import SSHError, read_only
    from clusterkit.schedulers.ssh import LoginNode

    profile, profile_path, _ = load_profile(args.cluster, Path.cwd())
    if profile.login is None:
        raise UsageError(f"{profile_path}: cluster profile {profile.name!r} names no login node (login: {{host: ...}})")
    login = profile.login
    runs_dir = args.runs_dir if args.runs_dir != DEFAULT_RUNS_DIR else (profile.runs_dir or DEFAULT_RUNS_DIR)

    def remote_ls(session):
        node = LoginNode(session, login)
        if not node.has_clusterkit:
            raise SSHError(f"ls --cluster needs clusterkit on {login.host} (login.python names its interpreter); "
                           f"`clusterkit ls` lists the runs submitted from this machine")
        return node.session.run(node.clusterkit("ls", "--runs-dir", runs_dir, "--limit", str(args.limit)),
                                stdout=sys.stdout.buffer, stderr=sys.stderr.buffer).returncode

    return read_only(login, remote_ls, args.accept_new_host_key)


def _over_ssh(record, args: argparse.Namespace, action, read_only_action: bool = True):
    """Run ``action(LoginNode)`` for an ssh run; read-only actions are retried on a dropped connection."""
    from clusterkit.schedulers.ssh_transport import connect, read_only
    from clusterkit.schedulers.ssh import LoginNode, login_of

    login = login_of(record)
    if read_only_action:
        return read_only(login, lambda session: action(LoginNode(session, login)), args.accept_new_host_key)
    with connect(login, args.accept_new_host_key) as session:
        return action(LoginNode(session, login))


def cmd_logs(args: argparse.Namespace) -> int:
    from clusterkit.runs.logs import log_files, stream_run

    record = _find(args)
    world = record.nodes * record.ranks_per_node
    if args.rank is not None and not 0 <= args.rank < world:
        raise UsageError(f"rank {args.rank} is not in this run ({'rank 0' if world == 1 else f'ranks 0-{world - 1}'})")
    if record.scheduler == "ssh":
        # Following streams for as long as the job runs: not retried, or output would repeat.
        return _over_ssh(record, args, lambda node: node.logs(record, args.rank, args.follow), not args.follow)
    if not log_files(record, args.rank) and not args.follow:
        print(f"no logs yet in {record.run_dir}", file=sys.stderr)
        return 1
    return stream_run(record, args.rank, follow=args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a job that has not ended; one that has is left as it is, and said so."""
    from clusterkit.runs.status import job_status

    def unless_ended(status_of, cancel) -> str | None:
        status = status_of(record)
        if status.done:
            return status.state
        cancel(record)
        return None

    record = _find(args)
    if record.scheduler == "ssh":
        ended = _over_ssh(record, args, lambda node: unless_ended(node.status, node.cancel), read_only_action=False)
    elif record.scheduler == "slurm":
        from clusterkit.schedulers import slurm as slurm_scheduler

        ended = unless_ended(job_status, slurm_scheduler.cancel)
    else:
        from clusterkit.schedulers import local as local_scheduler

        ended = unless_ended(job_status, local_scheduler.cancel)
    print(f"job {record.job_id} already ended ({ended}): nothing cancelled" if ended else f"cancelled job {record.job_id}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from clusterkit.runs.export import export_model

    run_dir = Path(args.run_dir)
    out_dir = Path(args.output) if args.output else run_dir / EXPORT_DIR
    checkpoint = export_model(run_dir, out_dir, Path(args.checkpoint) if args.checkpoint else None)
    print(f"exported {checkpoint} to {out_dir}/ (load with from_pretrained({str(out_dir)!r}))")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from clusterkit.load.loader import load_recipe
    from clusterkit.plan.report import apply_layout, print_plan
    from clusterkit.plan.planner import PlanError, plan

    loaded = load_recipe(args.recipe, args.set or ())
    try:
        result = plan(loaded, top=args.top, global_batch=args.global_batch)
    except PlanError as exc:  # said of this recipe
        raise LocatedError(f"{loaded.path}: {exc.args[0]}") from None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_plan(loaded, result)
    if args.apply is not None:
        if not result.ranked:
            print("no layout fits: nothing applied", file=sys.stderr)
            return 1
        target = apply_layout(loaded, result.ranked[0].layout, Path(args.apply) if args.apply else None)
        print(f"wrote the best layout into {target}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers, e.g. 1,2,4")
    return values


def _whole_number(limit: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``limit``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 1 <= value <= limit:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number from 1 to {limit:,}")
        return value
    return parse


def cmd_bench(args: argparse.Namespace) -> int:
    import datetime

    from clusterkit.diagnose.bench import Scale, read_result, table_rows, wait_all, with_scaling, write_outputs
    from clusterkit.runs.status import job_status
    from clusterkit.schedulers.api import schedule

    warmup = args.warmup if args.warmup is not None else min(max(1, args.steps // 5), args.steps - 1)
    if not 0 <= warmup < args.steps:
        print(f"clusterkit bench: --warmup {warmup}: give 0 to {args.steps - 1} (fewer than --steps {args.steps})",
              file=sys.stderr)
        return EXIT_USAGE
    base, _ = _prepare_submission(args)
    if base.recipe.task.trainer is None:
        raise UsageError(f"{base.path}: bench measures the built-in runner's metrics; this recipe runs task.script")
    p = base.recipe.parallelism
    scales = [Scale(n, g) for g in (args.gpus_per_node or [base.recipe.resources.gpus_per_node]) for n in args.nodes]
    scales.sort(key=lambda scale: scale.gpus)
    records, states = [], {}
    for scale in scales:
        extra = scale.overrides(args.steps, p.micro_batch_size, p.gradient_accumulation_steps)
        if records and records[-1].scheduler == "slurm":
            extra.append(f"resources.extra_sbatch.dependency=afterany:{records[-1].job_id}")
        _, request = _prepare_submission(args, extra)
        if request.scheduler == "ssh":
            raise UsageError("clusterkit bench runs where sbatch is (or locally), not over SSH")
        records.append(schedule(request))
        if request.scheduler == "local":  # no queue to order them: one after another
            states.update(wait_all(records[-1:], job_status))
    how = ("as dependent jobs (each after the previous ends: afterany), not a job array, whose tasks would "
           "share one node count" if records[0].scheduler == "slurm" else "one after another (local executor)")
    print(f"submitted {len(scales)} scales {how}: jobs {', '.join(r.job_id for r in records)}")
    states.update(wait_all([r for r in records if r.job_id not in states], job_status))
    results = with_scaling([read_result(scale, record, states[record.job_id], warmup)
                            for scale, record in zip(scales, records)])
    from rich.console import Console
    from rich.table import Table

    table = Table("GPUs", "nodes x GPUs", "samples/s", "speedup", "efficiency", "comm share", "state",
                  title=f"{base.recipe.name}: {args.steps} steps per scale, first {warmup} excluded")
    for row in table_rows(results):
        table.add_row(*row)
    Console().print(table)
    print("comm share: n/a: DDP overlaps its all-reduces with the backward pass, so the runner cannot time them apart")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.output) if args.output else Path(records[0].run_dir).parent / f"bench-{stamp}"
    meta = {"name": base.recipe.name, "recipe": str(base.path), "steps": args.steps, "warmup_steps": warmup,
            "submitted_as": how}
    for path in write_outputs(results, out_dir, meta):
        print(f"wrote {path}")
    return 0 if all(state == "COMPLETED" for state in states.values()) else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from clusterkit.diagnose.doctor import FAIL, diagnose, gather, print_report, to_json

    checks = diagnose(gather(in_job=args.in_job, dataloader_workers=args.dataloader_workers))
    if args.json:
        print(json.dumps(to_json(checks), indent=2))
    else:
        print_report(checks)
    return 1 if any(check.verdict == FAIL for check in checks) else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from clusterkit.spec.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2, sort_keys=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from clusterkit import __version__

    parser = argparse.ArgumentParser(
        prog="clusterkit",
        description="From a YAML recipe to a running multi-node SLURM training job.",
    )
    parser.add_argument("--version", action="version", version=f"clusterkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_host_keys(p: argparse.ArgumentParser) -> None:
        p.add_argument("--accept-new-host-key", action="store_true",
                       help="SSH: trust a login node (or jump host) not yet in known_hosts and add it there; "
                            "check its fingerprint first. A changed key is always refused")

    def with_local_target(p: argparse.ArgumentParser) -> None:
        """Where jobs that clusterkit then waits on run: SLURM here, or the local executor."""
        p.add_argument("--executor", choices=("slurm", "local"), help="default: slurm if sbatch is on PATH, else local")
        p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile to run on, instead of the recipe's")
        p.add_argument("--template-dir", action="append", metavar="DIR", help="look up templates here first")
        with_overrides(p)

    def with_overrides(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE",
                       help="override a recipe value (YAML syntax), e.g. --set resources.nodes=4; repeatable")

    p = sub.add_parser("validate", help="check recipes (files or folders); exit 2 on any error")
    p.add_argument("recipes", nargs="+", metavar="RECIPE")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    with_overrides(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="dry run: write the job's files without submitting")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("-o", "--output", metavar="DIR", help="output directory (default ./render/<name>)")
    p.add_argument("--template-dir", action="append", metavar="DIR",
                   help="look up templates here first (repeatable); see also $CLUSTERKIT_TEMPLATES")
    with_overrides(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("submit", help="validate, render and submit (SLURM where sbatch exists, else local)")
    p.add_argument("recipe", metavar="RECIPE", nargs="?")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an earlier run from its newest checkpoint (its recipe, unless RECIPE is given)")
    p.add_argument("--from-scratch", action="store_true",
                   help="with --resume: run it again from step 0 (without it, a run with no complete checkpoint is refused)")
    p.add_argument("--dry-run", action="store_true", help="print the exact batch script that would be submitted")
    p.add_argument("--follow", action="store_true", help="stream progress until the job ends; exit 1 if it failed")
    p.add_argument("--executor", choices=("slurm", "local", "ssh"),
                   help="default: slurm if sbatch is on PATH, else ssh if the cluster profile names a login node, else local")
    p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile to run on (name or file), instead of the recipe's")
    p.add_argument("--template-dir", action="append", metavar="DIR", help="look up templates here first")
    p.add_argument("--bundle", metavar="DIR", help=argparse.SUPPRESS)  # a remote clusterkit's upload
    with_overrides(p)
    with_host_keys(p)
    p.set_defaults(func=cmd_submit)

    def with_job(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("job", nargs=None if required else "?", metavar="JOB", help="job id or run directory")
        p.add_argument("--runs-dir", default=DEFAULT_RUNS_DIR, help="where runs are looked up (default ./runs)")
        with_host_keys(p)

    p = sub.add_parser("status", help="state of one job, or of the recent runs")
    with_job(p, required=False)
    p.add_argument("--limit", type=_whole_number(1_000_000), default=10, help="how many recent runs (default 10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ls", help="recent runs with their state")
    p.add_argument("--runs-dir", default=DEFAULT_RUNS_DIR, help="where runs are looked up (default ./runs)")
    p.add_argument("--limit", type=_whole_number(1_000_000), default=20, help="how many recent runs (default 20)")
    p.add_argument("--cluster", metavar="PROFILE", help="list the runs on that cluster's login node instead (over SSH)")
    with_host_keys(p)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("logs", help="a job's logs (all nodes, or one rank)")
    with_job(p)
    p.add_argument("--rank", type=int, help="global rank whose own output to show")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a job")
    with_job(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("export", help="a from_pretrained-loadable model from a run's newest checkpoint (ZeRO shards consolidated)")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--checkpoint", metavar="DIR", help="a specific checkpoint directory (default: the newest)")
    p.add_argument("-o", "--output", metavar="DIR", help=f"default RUN_DIR/{EXPORT_DIR}")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="per-GPU memory estimate, strategy advice and the best layouts for this cluster")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--top", type=_whole_number(1000), default=5, help="how many ranked layouts to show (1-1000)")
    p.add_argument("--global-batch", type=_whole_number(100_000_000), help="plan for another global batch size")
    p.add_argument("--apply", nargs="?", const="", metavar="PATH",
                   help="write the best layout into a copy of the recipe (default <recipe>.planned.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    with_overrides(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("preflight", help="run only the all-reduce preflight on a recipe's layout; print bus bandwidth per size and node")
    p.add_argument("recipe", metavar="RECIPE")
    with_local_target(p)
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("bench", help="run a recipe at several scales; samples/s, speedup and scaling efficiency (table, JSON, PNG)")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--nodes", type=_int_list, required=True, metavar="N,N,...", help="node counts, e.g. 1,2,4")
    p.add_argument("--gpus-per-node", type=_int_list, metavar="G,G,...", help="GPUs per node to try (default the recipe's)")
    p.add_argument("--steps", type=_whole_number(1_000_000_000), default=20, help="training steps per scale (default 20)")
    p.add_argument("--warmup", type=int, metavar="STEPS", help="steps left out of the measurement (default steps/5)")
    p.add_argument("-o", "--output", metavar="DIR", help="where bench.json and bench.png go (default beside the runs)")
    with_local_target(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("doctor", help="check this node: torch/CUDA/NCCL, GPUs and their links, RAM, /dev/shm, network env")
    p.add_argument("--in-job", action="store_true", help="inside an allocation: compare what torch sees with what SLURM allocated")
    p.add_argument("--dataloader-workers", type=int, default=2, metavar="N", help="per rank, for the /dev/shm check (default 2)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("schema", help="print the recipe JSON Schema (for editors)")
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ClusterkitError as exc:
        return report(exc)
    except OSError as exc:  # one that no command turned into ours: the user's path, or this machine's
        error = PathError if is_users_path_error(exc) else FileSystemError
        return report(error(f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror or str(exc)))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def report(error: ClusterkitError) -> int:
    """The one place an error becomes what the user sees: one line (a line per finding of a
    recipe), and the exit code of its kind."""
    print(error if isinstance(error, LocatedError) else f"clusterkit: {error}", file=sys.stderr)
    return EXIT_USAGE if isinstance(error, UserError) else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

"""The ``clusterkit`` command line.

render/validate/schema import nothing heavy (no torch, transformers, deepspeed, paramiko, submitit):
they must start fast on a login node. Commands that talk to SLURM import their modules lazily.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from clusterkit.errors import RecipeError

EXIT_USAGE = 2


def _recipe_files(paths: Sequence[str]) -> list[Path]:
    """Recipe paths, expanding directories to the recipes inside (ops teams lint whole folders)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.y*ml") if "clusters" not in p.relative_to(path).parts)
            files.extend(found)
        else:
            files.append(path)
    return files


def _print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def cmd_validate(args: argparse.Namespace) -> int:
    from clusterkit.loader import load_recipe

    failed = 0
    files = _recipe_files(args.recipes)
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
    if len(files) > 1 and not args.quiet:
        print(f"{len(files) - failed} of {len(files)} recipes valid")
    return EXIT_USAGE if failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    from clusterkit.loader import load_recipe
    from clusterkit.render import render_job, write_rendered

    loaded = load_recipe(args.recipe, args.set or ())
    job = render_job(loaded, tuple(args.template_dir or ()))
    out_dir = Path(args.output or f"render/{job.name}")
    write_rendered(job, out_dir)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    _print_table(job.summary)
    print(f"wrote {', '.join(job.files)} to {out_dir}/")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from clusterkit.loader import load_recipe
    from clusterkit.render import render_job
    from clusterkit.submission import dry_run, schedule

    recipe, overrides = args.recipe, list(args.set or ())
    if args.resume:
        from clusterkit.runs import read_record

        earlier = read_record(Path(args.resume))
        # The earlier run's recipe and --set values, then this command's, then where to resume from.
        recipe = recipe or earlier.recipe
        overrides = [*earlier.overrides, *overrides, f"resume_from={Path(args.resume).absolute()}"]
    if recipe is None:
        raise SystemExit("clusterkit submit: give a RECIPE, or --resume RUN_DIR")
    loaded = load_recipe(recipe, overrides)
    request = dry_run(loaded, render_job(loaded, tuple(args.template_dir or ())), args.executor)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    if args.dry_run:
        print(f"# would run: {' '.join(request.argv)}", file=sys.stderr)
        sys.stdout.write(request.script)
        return 0
    record = schedule(request)
    print(f"submitted job {record.job_id} ({request.scheduler} executor)")
    print(f"run dir: {record.run_dir}")
    print(f"follow:  clusterkit logs {record.job_id} -f   |   clusterkit status {record.job_id}")
    if args.follow:
        from clusterkit.follow import follow
        from clusterkit.jobstate import COMPLETED

        return 0 if follow(record).state == COMPLETED else 1
    return 0


def _runs_dir(args: argparse.Namespace) -> Path:
    return Path(args.runs_dir)


def _find(args: argparse.Namespace):
    from clusterkit.runs import find_run

    return find_run(args.job, _runs_dir(args))


def cmd_status(args: argparse.Namespace) -> int:
    from clusterkit.jobstate import job_status
    from clusterkit.runs import list_runs

    records = [_find(args)] if args.job else list_runs(_runs_dir(args))[: args.limit]
    if not records:
        print(f"no runs under {_runs_dir(args)}")
        return 0
    for record in records:
        status = job_status(record)
        line = f"{record.job_id}  {record.name}  {status.state}"
        if status.exit_code is not None:
            line += f"  exit {status.exit_code}"
        if status.reason:
            line += f"  ({status.reason})"
        print(line)
        if args.job:
            print(f"  run dir: {record.run_dir}")
            print(f"  layout:  {record.nodes} nodes x {record.ranks_per_node} ranks, {record.launcher}, {record.scheduler} executor")
        if status.failure:
            print(f"  first failure: {status.failure}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    import datetime

    from clusterkit.jobstate import job_status
    from clusterkit.runs import list_runs

    records = list_runs(_runs_dir(args))[: args.limit]
    if not records:
        print(f"no runs under {_runs_dir(args)}")
        return 0
    rows = [("JOB", "NAME", "STATE", "SUBMITTED", "LAYOUT", "RUN DIR")]
    for record in records:
        when = datetime.datetime.fromtimestamp(record.submitted_at).strftime("%Y-%m-%d %H:%M")
        rows.append((record.job_id, record.name, job_status(record).state, when,
                     f"{record.nodes}x{record.ranks_per_node} {record.launcher}", record.run_dir))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from clusterkit.logs import log_files, stream

    record = _find(args)
    files = log_files(record, args.rank)
    if not files:
        print(f"no logs yet in {record.run_dir}", file=sys.stderr)
        return 1 if not args.follow else stream(record, args.rank, follow=True)
    return stream(record, args.rank, follow=args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    record = _find(args)
    if record.scheduler == "slurm":
        from clusterkit.slurm_scheduler import cancel
    else:
        from clusterkit.local_scheduler import cancel
    cancel(record)
    print(f"cancelled job {record.job_id}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from clusterkit.export import export_model

    run_dir = Path(args.run_dir)
    out_dir = Path(args.output) if args.output else run_dir / "export"
    checkpoint = export_model(run_dir, out_dir, Path(args.checkpoint) if args.checkpoint else None)
    print(f"exported {checkpoint} to {out_dir}/ (load with from_pretrained({str(out_dir)!r}))")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from clusterkit.loader import load_recipe
    from clusterkit.plan_report import apply_layout, print_plan
    from clusterkit.planner import PlanError, plan

    loaded = load_recipe(args.recipe, args.set or ())
    try:
        result = plan(loaded, top=args.top, global_batch=args.global_batch)
    except PlanError as exc:
        print(f"{loaded.path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
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


def cmd_schema(args: argparse.Namespace) -> int:
    from clusterkit.recipe import recipe_json_schema

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
    p.add_argument("--dry-run", action="store_true", help="print the exact batch script that would be submitted")
    p.add_argument("--follow", action="store_true", help="stream progress until the job ends; exit 1 if it failed")
    p.add_argument("--executor", choices=("slurm", "local"), help="default: slurm if sbatch is on PATH, else local")
    p.add_argument("--template-dir", action="append", metavar="DIR", help="look up templates here first")
    with_overrides(p)
    p.set_defaults(func=cmd_submit)

    def with_job(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("job", nargs=None if required else "?", metavar="JOB", help="job id or run directory")
        p.add_argument("--runs-dir", default="./runs", help="where runs are looked up (default ./runs)")

    p = sub.add_parser("status", help="state of one job, or of the recent runs")
    with_job(p, required=False)
    p.add_argument("--limit", type=int, default=10)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ls", help="recent runs with their state")
    p.add_argument("--runs-dir", default="./runs", help="where runs are looked up (default ./runs)")
    p.add_argument("--limit", type=int, default=20)
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
    p.add_argument("-o", "--output", metavar="DIR", help="default RUN_DIR/export")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="per-GPU memory estimate, strategy advice and the best layouts for this cluster")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--top", type=int, default=5, help="how many ranked layouts to show")
    p.add_argument("--global-batch", type=int, help="plan for another global batch size")
    p.add_argument("--apply", nargs="?", const="", metavar="PATH",
                   help="write the best layout into a copy of the recipe (default <recipe>.planned.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    with_overrides(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the recipe JSON Schema (for editors)")
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RecipeError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except LookupError as exc:  # an unknown job id or run directory
        print(f"clusterkit: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"clusterkit: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as exc:  # the scheduler refused or failed a command
        print(f"clusterkit: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

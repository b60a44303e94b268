"""Commands on recipes alone, nothing submitted: validate, render, plan, schema. They import
nothing heavy (no torch, paramiko or rich until plan prints): they must start fast on a login node."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from clusterkit.cli.common import (
    EXIT_USAGE,
    print_json,
    print_table,
    program_args,
    template_dirs,
    whole_number,
    with_json,
    with_overrides,
    with_program_args,
)

if TYPE_CHECKING:
    from pathlib import Path

    from clusterkit.errors import RecipeError


def _recipe_files(paths: Sequence[str]) -> tuple[list[Path], int]:
    """Recipe paths, expanding directories to the recipes inside (ops teams lint whole folders),
    and how many base files (extended by a recipe there, no recipe alone) a folder held."""
    from pathlib import Path

    from clusterkit.errors import UsageError
    from clusterkit.load.loader import base_recipes

    files: list[Path] = []
    skipped = 0
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.y*ml") if "clusters" not in p.relative_to(path).parts)
            bases = base_recipes(found)
            if len(bases) == len(found):  # a typo'd folder, or the wrong one: "all valid" would be a lie
                raise UsageError(f"{path}: no recipe (*.yaml, *.yml) in this folder")
            files.extend(p for p in found if p not in bases)
            skipped += len(bases)
        else:
            files.append(path)
    return files, skipped


def cmd_validate(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.errors import RecipeError

    files, bases_skipped = _recipe_files(args.recipes)
    reports = []
    for path in files:
        try:
            checked = api.validate(path, args.set)
        except RecipeError as exc:
            reports.append(
                {"path": str(path), "ok": False, "errors": findings_json(exc), "warnings": [], "sweep_points": None}
            )
            if not args.json:
                print(exc, file=sys.stderr)
            continue
        reports.append(
            {
                "path": str(path),
                "ok": True,
                "errors": [],
                "warnings": checked.warnings,
                "sweep_points": checked.sweep_points,
            }
        )
        if args.json:
            continue
        for warning in checked.warnings:
            print(warning, file=sys.stderr)
        if not args.quiet:
            print(f"{path}: ok" + (f" ({checked.sweep_points} sweep points)" if checked.sweep_points else ""))
    valid = sum(report["ok"] for report in reports)
    if args.json:
        print_json({"recipes": reports, "valid": valid, "total": len(files), "base_files_skipped": bases_skipped})
    elif (len(files) > 1 or bases_skipped) and not args.quiet:
        skipped = f" ({bases_skipped} base file{'s' if bases_skipped != 1 else ''} skipped)" if bases_skipped else ""
        print(f"{valid} of {len(files)} recipes valid{skipped}")
    return EXIT_USAGE if valid < len(files) else 0


def findings_json(error: RecipeError) -> list[dict]:
    """Each finding of a recipe error as ``{file, line, key, message}``."""
    from clusterkit.errors import format_key_path

    return [
        {
            "file": finding.location.file,
            "line": finding.location.line,
            "key": format_key_path(finding.key_path),
            "message": finding.message,
        }
        for finding in getattr(error, "findings", [error.finding])
    ]


def cmd_render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clusterkit import __version__, api
    from clusterkit.render.output_dir import write_render

    loaded = api.load_recipe(args.recipe, [*(args.set or ()), *program_args(args)])
    job = api.render_job(loaded, template_dirs=template_dirs(args))
    out_dir = write_render(
        job.files, Path(args.output or f"render/{job.name}"), f"clusterkit {__version__} render of {loaded.path}"
    )
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    if args.json:
        print_json(
            {
                "name": job.name,
                "output_dir": str(out_dir),
                "script": job.script_name,
                "files": sorted(job.files),
                "summary": dict(job.summary),
            }
        )
        return 0
    print_table(job.summary)
    shown = sorted({name.split("/")[0] + ("/" if "/" in name else "") for name in job.files})
    print(f"wrote {', '.join(shown)} to {out_dir}/")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clusterkit.errors import LocatedError
    from clusterkit.load.loader import load_recipe
    from clusterkit.plan.planner import PlanError, plan
    from clusterkit.plan.report import apply_layout, print_plan

    loaded = load_recipe(args.recipe, args.set or ())
    try:
        result = plan(loaded, top=args.top, global_batch=args.global_batch)
    except PlanError as exc:  # said of this recipe
        raise LocatedError(f"{loaded.path}: {exc.args[0]}") from None
    if args.json:
        print_json(result.to_json())
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
    if args.profile:
        from clusterkit.spec.schema import profile_json_schema as json_schema
    else:
        from clusterkit.spec.schema import recipe_json_schema as json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check recipes (files or folders); exit 2 on any error")
    p.add_argument("recipes", nargs="+", metavar="RECIPE")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    with_json(p)
    with_overrides(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="dry run: write the job's files without submitting")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("-o", "--output", metavar="DIR", help="output directory (default ./render/<name>)")
    p.add_argument(
        "--template-dir",
        action="append",
        metavar="DIR",
        help="look up templates here first (repeatable); see also $CLUSTERKIT_TEMPLATES",
    )
    with_json(p)
    with_overrides(p)
    with_program_args(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("plan", help="per-GPU memory estimate, strategy advice and the best layouts for this cluster")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--top", type=whole_number(1000), default=5, help="how many ranked layouts to show (1-1000)")
    p.add_argument("--global-batch", type=whole_number(100_000_000), help="plan for another global batch size")
    p.add_argument(
        "--apply",
        nargs="?",
        const="",
        metavar="PATH",
        help="write the best layout into a copy of the recipe (default <recipe>.planned.yaml)",
    )
    with_json(p)
    with_overrides(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the recipe (or cluster profile) JSON Schema, for editors")
    p.add_argument("--profile", action="store_true", help="the schema of a cluster profile instead of a recipe")
    p.set_defaults(func=cmd_schema)

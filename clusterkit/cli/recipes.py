"""Commands on recipes alone, nothing submitted: validate, render, plan, schema. They import
nothing heavy (no torch, paramiko or rich until plan prints): they must start fast on a login node."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from clusterkit.cli.common import EXIT_USAGE, print_table, template_dirs, whole_number, with_overrides
from clusterkit.errors import LocatedError, RecipeError


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


def cmd_validate(args: argparse.Namespace) -> int:
    from clusterkit.load.loader import load_recipe
    from clusterkit.load.sweep import load_sweep

    failed = 0
    files, bases_skipped = _recipe_files(args.recipes)
    for path in files:
        try:
            loaded = load_recipe(path, args.set or ())
            sweep = load_sweep(loaded)  # a sweep's every point must be valid too
        except RecipeError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        for warning in loaded.warnings:
            print(warning, file=sys.stderr)
        if not args.quiet:
            print(f"{path}: ok" + (f" ({len(sweep.points)} sweep points)" if sweep else ""))
    if (len(files) > 1 or bases_skipped) and not args.quiet:
        skipped = f" ({bases_skipped} base file{'s' if bases_skipped != 1 else ''} skipped)" if bases_skipped else ""
        print(f"{len(files) - failed} of {len(files)} recipes valid{skipped}")
    return EXIT_USAGE if failed else 0


def cmd_render(args: argparse.Namespace) -> int:
    from clusterkit import __version__
    from clusterkit.load.loader import load_recipe
    from clusterkit.load.sweep import load_sweep
    from clusterkit.render.job import render_job
    from clusterkit.render.output_dir import write_render
    from clusterkit.render.sweep import render_sweep

    loaded = load_recipe(args.recipe, args.set or ())
    sweep = load_sweep(loaded)
    job = render_sweep(sweep, template_dirs(args)) if sweep else render_job(loaded, template_dirs(args))
    out_dir = write_render(job.files, Path(args.output or f"render/{job.name}"),
                           f"clusterkit {__version__} render of {loaded.path}")
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    print_table(job.summary)
    shown = sorted({name.split("/")[0] + ("/" if "/" in name else "") for name in job.files})
    print(f"wrote {', '.join(shown)} to {out_dir}/")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from clusterkit.load.loader import load_recipe
    from clusterkit.plan.planner import PlanError, plan
    from clusterkit.plan.report import apply_layout, print_plan

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


def cmd_schema(args: argparse.Namespace) -> int:
    from clusterkit.spec.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2, sort_keys=True))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
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

    p = sub.add_parser("plan", help="per-GPU memory estimate, strategy advice and the best layouts for this cluster")
    p.add_argument("recipe", metavar="RECIPE")
    p.add_argument("--top", type=whole_number(1000), default=5, help="how many ranked layouts to show (1-1000)")
    p.add_argument("--global-batch", type=whole_number(100_000_000), help="plan for another global batch size")
    p.add_argument("--apply", nargs="?", const="", metavar="PATH",
                   help="write the best layout into a copy of the recipe (default <recipe>.planned.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    with_overrides(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the recipe JSON Schema (for editors)")
    p.set_defaults(func=cmd_schema)

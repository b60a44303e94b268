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
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Commands that start a recipe: ``import`` (a hand-written batch script, read, never run) and
``new`` (a commented recipe for a common start). Each result is validated before it is written,
and an existing file is never overwritten."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from clusterkit.cli.common import print_json, with_json

if TYPE_CHECKING:
    from pathlib import Path


def write_new(path: str, text: str) -> None:
    """``text`` into a file that must not exist yet (never overwritten, not even by a race)."""
    from clusterkit.errors import UsageError

    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise UsageError(f"{path}: exists already; clusterkit never overwrites a file (choose another -o)") from None
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(text)


def checked(
    recipe_text: str, cluster: str | None, profile_text: str | None = None, folder: str | Path = "."
) -> tuple[Any, list[str]]:
    """The recipe text validated as ``clusterkit validate`` does, and its rendered job's files: as a
    hidden file in ``folder`` (where the recipe goes: its relative paths name files there), removed
    after. ``profile_text``: the derived profile the recipe names as ``cluster: cluster.yaml``. A
    recipe that does not validate is one UsageError line per finding."""
    from pathlib import Path

    from clusterkit import api
    from clusterkit.errors import RecipeError, UsageError

    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: no such folder for the recipe")
    written: list[str] = []
    try:
        if profile_text is not None:
            written.append(_hidden(folder, profile_text))
            recipe_text = recipe_text.replace("cluster: cluster.yaml", f"cluster: {Path(written[-1]).name}", 1)
        written.append(_hidden(folder, recipe_text))
        api.validate(written[-1], cluster=cluster)
        loaded = api.load_recipe(written[-1], cluster=cluster)
        warnings = [str(w).replace(written[-1], "the imported recipe") for w in loaded.warnings]
        return api.render_job(loaded).files, warnings
    except RecipeError as exc:
        raise UsageError(f"the recipe does not validate: {str(exc).replace(written[-1], 'recipe')}") from None
    finally:
        for path in written:
            os.unlink(path)


def _hidden(folder: str | Path, text: str) -> str:
    descriptor, path = tempfile.mkstemp(prefix=".clusterkit-import-", suffix=".yaml", dir=folder)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(text)
    return path


def cmd_import(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from clusterkit.errors import UsageError
    from clusterkit.load.import_yaml import derived_profile, printable, recipe_yaml
    from clusterkit.load.script_compare import differences, rendered_parts, script_parts
    from clusterkit.load.script_text import read_script

    if args.output and os.path.lexists(args.output):
        raise UsageError(f"{args.output}: exists already; clusterkit never overwrites a file (choose another -o)")
    profile_path = str(Path(args.output).with_suffix(".cluster.yaml")) if args.output else ""
    if args.output and not args.cluster and os.path.lexists(profile_path):
        raise UsageError(f"{profile_path}: exists already; clusterkit never overwrites a file (give --cluster)")
    script = read_script(args.script)
    profile = None
    if args.cluster:
        from clusterkit.load.loader import load_profile

        profile = load_profile(args.cluster, Path.cwd())[0]
    from clusterkit.load.import_script import import_script

    imported = import_script(script, profile)
    profile_text = None if args.cluster else derived_profile(imported)
    cluster = str(Path(args.cluster).absolute()) if args.cluster and "/" in args.cluster else args.cluster
    text = recipe_yaml(imported, args.script, cluster or "cluster.yaml")
    folder = os.path.dirname(os.path.abspath(args.output)) if args.output else "."
    files, warnings = checked(text, cluster, profile_text, folder)
    diff = differences(script_parts(script), rendered_parts(files["job.sbatch"], json.loads(files["plan.json"])))
    if not args.cluster and args.output:
        text = text.replace("cluster: cluster.yaml", f"cluster: {Path(profile_path).name}", 1)
        write_new(profile_path, profile_text or "")
    if args.output:
        write_new(args.output, text)
    report = {
        "script": args.script,
        "recipe": args.output,
        "lines_mapped": len(set(imported.mapped)),
        "lines_kept_as_setup": len(set(imported.kept)),
        "not_mapped": [{"line": u.line, "text": u.text, "why": u.why, "nearest": u.nearest} for u in imported.unmapped],
        "warnings": imported.warnings + warnings,
        "differences": diff,
    }
    if args.json:
        print_json(report)
        return 0
    shown = printable(args.script)
    if not args.output:
        print(text, end="")
    out = sys.stderr if not args.output else sys.stdout
    print(f"{shown}: {report['lines_mapped']} lines mapped to fields, {report['lines_kept_as_setup']} kept as "
          f"setup/hook lines, {len(imported.unmapped)} not mapped", file=out)  # fmt: skip
    for item in imported.unmapped:
        print(
            f"  {shown}:{item.line}: not mapped: {printable(item.text[:100])} ({item.why}; nearest: {item.nearest})",
            file=out,
        )
    for warning in report["warnings"]:
        print(f"  warning: {printable(warning)}", file=out)
    print(f"render vs the script ({len(diff)} differences in header options, env and launch):", file=out)
    for line in diff:
        print(f"  {printable(line)}", file=out)
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clusterkit.load.new_recipe import new_recipe

    text = new_recipe(args.script, args.trainer, args.nodes, args.gpus, args.cluster or "dev", args.zero3)
    cluster = str(Path(args.cluster).absolute()) if args.cluster and "/" in args.cluster else None
    checked(text, cluster, folder=os.path.dirname(os.path.abspath(args.output)) if args.output else ".")
    if args.output:
        write_new(args.output, text)
        print(f"{args.output}: written (validated); next: clusterkit render {args.output}")
    else:
        print(text, end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="a hand-written batch script as a recipe (read, never run)")
    p.add_argument("script", metavar="SCRIPT")
    p.add_argument("-o", "--output", metavar="FILE", help="write the recipe here (never overwritten)")
    p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile (default: one derived from the header)")
    with_json(p)
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("new", help="a commented recipe for a common start, validated before it is written")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--script", metavar="FILE", help="your training script, started by torchrun")
    start.add_argument("--trainer", metavar="MODEL", help="the built-in Trainer with this model (e.g. gpt2)")
    p.add_argument("--zero3", action="store_true", help="DeepSpeed ZeRO-3 (launcher: deepspeed)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node (default: the profile's)")
    p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile (default: dev)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the recipe here (never overwritten)")
    p.set_defaults(func=cmd_new)

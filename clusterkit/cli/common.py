"""What several command groups share: option groups, argument types, the submit options."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

EXIT_USAGE = 2  # a user error: the input, an argument or a chosen path is wrong
EXIT_FAILURE = 1  # an external failure: the scheduler, the login node or this machine
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
TEMPLATES_ENV = "CLUSTERKIT_TEMPLATES"  # colon-separated ops template directories
DEFAULT_RUNS_DIR = "./runs"
# Left None by the parser: cli.config.fill_runs_dir puts in the user config's (a flag wins over it).
RUNS_DIR_HELP = "where runs are looked up (default: the user config's runs_dir, else ./runs; a job id not there is looked up in the run index)"


def template_dirs(args: argparse.Namespace) -> tuple[str, ...]:
    """The template directories before the recipe's own and the built-ins, first match wins:
    ``--template-dir`` (repeatable), then $CLUSTERKIT_TEMPLATES. Read here: rendering is pure."""
    from_env = [d for d in os.environ.get(TEMPLATES_ENV, "").split(os.pathsep) if d]
    return (*(args.template_dir or ()), *from_env)


def submit_choices(args: argparse.Namespace):
    """The flags of a submitting command as the API's typed choices."""
    from clusterkit.api import SubmitChoices

    return SubmitChoices(
        executor=args.executor,
        template_dirs=template_dirs(args),
        resume=getattr(args, "resume", None),
        from_scratch=getattr(args, "from_scratch", False),
        grid=tuple(getattr(args, "grid", None) or ()),
        max_parallel=getattr(args, "max_parallel", None),
        chain=getattr(args, "chain", None),
        after=tuple(job for text in getattr(args, "after", None) or () for job in text.split(",")),
        after_type=getattr(args, "after_type", "afterok"),
        singleton=getattr(args, "singleton", False),
        args=getattr(args, "program_args", None),
    )


def submit_options(args: argparse.Namespace):
    """The same flags as the options the launch layer takes (bench submits through it)."""
    import dataclasses

    from clusterkit.launch.prepare import SubmitOptions

    return SubmitOptions(
        recipe=args.recipe,
        overrides=tuple(args.set or ()),
        cluster=args.cluster,
        **dataclasses.asdict(submit_choices(args)),
    )


def code_words(record) -> str:
    """Where the run's code came from: "<run dir>/code: git <commit> (dirty) of /repo", or a folder's copy."""
    if record.code_dirty is None:
        return f"code/ in the run dir, a copy of {record.code_from}"
    commit = record.code_commit[:12] if record.code_commit else "no commit yet"
    return f"code/ in the run dir, git {commit}{' + uncommitted changes' if record.code_dirty else ''} of {record.code_from}"


def record_json(record) -> dict:
    """A run record as --json prints it (docs/json.md: "run")."""
    import dataclasses

    return dataclasses.asdict(record)


def status_json(status) -> dict:
    """A job status as --json prints it (docs/json.md: "status")."""
    import dataclasses

    return dataclasses.asdict(status)


def print_json(value: object) -> None:
    """One JSON document on stdout: the shapes are documented in docs/json.md and kept stable."""
    import json

    print(json.dumps(value, indent=2))


def with_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output (shapes: docs/json.md)")


def print_columns(rows: list[tuple[str, ...]]) -> None:
    """Rows of cells (a header first) in left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers, e.g. 1,2,4")
    return values


def whole_number(limit: int) -> Callable[[str], int]:
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


def with_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY.PATH=VALUE",
        help="override a recipe value (YAML syntax), e.g. --set resources.nodes=4; repeatable",
    )


def with_program_args(p: argparse.ArgumentParser) -> None:
    """``RECIPE -- ARGS...``: the words after the first ``--`` are the script's arguments, after
    task.args, whatever they look like (cli.parser.Parser); call it after the command's options."""
    p.after_dashes = "program_args"  # type: ignore[attr-defined]
    # argparse's usage line cannot say the words after "--".
    p.usage = p.format_usage().removeprefix("usage: ").rstrip() + " [-- ARGS ...]"


def program_args(args: argparse.Namespace) -> list:
    """The overrides the words after ``--`` make (none where none were given)."""
    if not getattr(args, "program_args", None):
        return []
    from clusterkit.load.loader import program_args_override

    return [program_args_override(args.program_args)]


def with_host_keys(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="SSH: trust a login node (or jump host) not yet in known_hosts and add it there; "
        "check its fingerprint first. A changed key is always refused",
    )


def with_local_target(p: argparse.ArgumentParser) -> None:
    """Where jobs that clusterkit then waits on run: SLURM here, or the local executor."""
    p.add_argument("--executor", choices=("slurm", "local"), help="default: slurm if sbatch is on PATH, else local")
    p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile to run on, instead of the recipe's")
    p.add_argument("--template-dir", action="append", metavar="DIR", help="look up templates here first")
    with_overrides(p)


def with_job(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("job", nargs=None if required else "?", metavar="JOB", help="job id or run directory")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    with_host_keys(p)

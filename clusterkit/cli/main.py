"""The ``clusterkit`` command line: the parser, assembled from one module per command group, and
the one place where an error becomes an exit code.

render/validate/schema import nothing heavy (no torch, transformers, deepspeed, paramiko, rich):
they must start fast on a login node. Each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from clusterkit.cli import completion, config, jobs, node, recipes, runs
from clusterkit.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE
from clusterkit.errors import ClusterkitError, FileSystemError, LocatedError, PathError, UserError, is_users_path_error

COMMAND_GROUPS = (recipes, jobs, runs, node, config, completion)


def build_parser() -> argparse.ArgumentParser:
    from clusterkit import __version__

    parser = argparse.ArgumentParser(
        prog="clusterkit",
        description="From a YAML recipe to a running multi-node SLURM training job.",
    )
    parser.add_argument("--version", action="version", version=f"clusterkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    completion.complete(parser)  # when the shell asks for completions: answers them and exits
    args = parser.parse_args(argv)
    try:
        config.fill_runs_dir(args)
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

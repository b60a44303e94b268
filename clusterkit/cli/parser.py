"""The ``clusterkit`` command line: the parser, assembled from one module per command group, and
the one place where an error becomes an exit code.

render/validate/schema import nothing heavy (no torch, transformers, deepspeed, paramiko, rich):
they must start fast on a login node. Each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import select
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from clusterkit.cli import (
    completion,
    config,
    gpus,
    hub,
    into_job,
    jobs,
    node,
    plot,
    profiles,
    recipes,
    report,
    runs,
    scaffold,
    stacks,
    top,
    tracking,
    watch,
)
from clusterkit.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE
from clusterkit.cli.examples import add_examples

if TYPE_CHECKING:
    from clusterkit.errors import ClusterkitError

COMMAND_GROUPS = (
    recipes,
    scaffold,
    hub,
    jobs,
    gpus,
    runs,
    report,
    top,
    watch,
    stacks,
    into_job,
    tracking,
    plot,
    node,
    profiles,
    config,
    completion,
)


class Parser(argparse.ArgumentParser):
    """argparse's parser, but one whose ``after_dashes`` names a destination takes every word after
    the first ``--`` as that list, whatever the words look like: a command and its own options
    (``exec JOB --node 1 -- ls --node x``), where argparse alone would match them to its options or
    drop a second ``--``. None there: no ``--`` was given."""

    after_dashes: str | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]  # argparse's own signature
        if self.after_dashes is None:
            return super().parse_known_args(args, namespace)
        words = list(sys.argv[1:] if args is None else args)
        cut = words.index("--") if "--" in words else len(words)
        namespace, extras = super().parse_known_args(words[:cut], namespace)
        setattr(namespace, self.after_dashes, words[cut + 1 :] if cut < len(words) else None)
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    from clusterkit import __version__

    parser = argparse.ArgumentParser(
        prog="clusterkit",
        description="From a YAML recipe to a running multi-node SLURM training job.",
    )
    parser.add_argument("--version", action="version", version=f"clusterkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for group in COMMAND_GROUPS:
        group.register(sub)
    add_examples(parser, sub)
    return parser


def run(arguments: Sequence[str]) -> int:
    """The command ``arguments`` name, run (:func:`clusterkit.cli.main.main`)."""
    parser = build_parser()
    completion.complete(parser)  # when the shell asks for completions: answers them and exits
    args = parser.parse_args(arguments)
    # Once a command runs: --help and a usage error need none of it.
    from clusterkit.errors import ClusterkitError, FileSystemError, PathError, is_users_path_error

    try:
        config.fill_runs_dir(args)
        return args.func(args)
    except ClusterkitError as exc:
        return report(exc)
    except OSError as exc:  # one that no command turned into ours: the user's path, or this machine's
        if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
            raise
        error = PathError if is_users_path_error(exc) else FileSystemError
        return report(error(f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror or str(exc)))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def stdout_reader_gone() -> bool:
    """Whether nothing reads our stdout any more (a pipe or socket whose other end closed), as
    opposed to a broken pipe of our own, such as an SSH connection, which is a failure to report."""
    poller = select.poll()
    try:
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError):  # stdout is no file (a test's capture)
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


def report(error: ClusterkitError) -> int:
    """The one place an error becomes what the user sees: one line (a line per finding of a
    recipe), and the exit code of its kind."""
    from clusterkit.errors import LocatedError, UserError

    print(error if isinstance(error, LocatedError) else f"clusterkit: {error}", file=sys.stderr)
    return EXIT_USAGE if isinstance(error, UserError) else EXIT_FAILURE

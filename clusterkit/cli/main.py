"""The ``clusterkit`` entry point: the command line, run through the parser
(:mod:`clusterkit.cli.parser`), with what no command can handle itself: a reader of stdout that
went away, a closed stdout, Ctrl-C before a command's own handler."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from clusterkit.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED
from clusterkit.cli.parser import run

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            return run(arguments)
        finally:
            if sys.stdout is not None:  # None: the shell closed it (`>&-`), and print() wrote nothing
                sys.stdout.flush()  # output still buffered meets a reader that went away here, not at exit
    except BrokenPipeError:
        # `clusterkit schema | head -1`: the reader has what it wanted. The Python docs' recipe, as
        # rich's Console does it for the tables: stdout goes to /dev/null so the interpreter's own
        # flush at exit cannot fail again, and the status is 1.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except KeyboardInterrupt:  # Ctrl-C while the parser is built (a command's own run has a handler)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

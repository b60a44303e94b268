"""The ``clusterkit`` entry point: ``--help`` from the help cache when it has it, ``validate`` from
the validation cache when nothing it read has changed (nothing else is imported then), anything
else through the parser (:mod:`clusterkit.cli.parser`)."""

from __future__ import annotations

import os
import sys

from clusterkit.cli import help_cache

TYPE_CHECKING = False  # typing alone costs a cached --help a third of its time
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            text = help_cache.cached_help(arguments)
            if text is not None:
                sys.stdout.write(text)
                return 0
            # Only as the process's own command: a program calling main() may have changed what
            # no record shows (a module's functions, say).
            recorded = argv is None and arguments[:1] == ["validate"]
            if recorded:
                from clusterkit.cli import validate_cache

                status = validate_cache.replay(arguments)
                if status is not None:
                    return status
            from clusterkit.cli.parser import run

            return validate_cache.validate(arguments, run) if recorded else run(arguments)
        finally:
            if sys.stdout is not None:  # None: the shell closed it (`>&-`), and print() wrote nothing
                sys.stdout.flush()  # output still buffered meets a reader that went away here, not at exit
    except BrokenPipeError:
        # `clusterkit schema | head -1`: the reader has what it wanted. The Python docs' recipe, as
        # rich's Console does it for the tables: stdout goes to /dev/null so the interpreter's own
        # flush at exit cannot fail again, and the status is 1.
        from clusterkit.cli.common import EXIT_FAILURE

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except KeyboardInterrupt:  # Ctrl-C while a cache answers (a command's own run has its handler)
        from clusterkit.cli.common import EXIT_INTERRUPTED

        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

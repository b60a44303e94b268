"""Reading a file that a user named or that another process keeps (a recipe, a cluster profile, the
user config, the run index, a run record, a secrets file), so that it cannot hang the command or
exhaust the machine's memory: regular files only, and at most a known size.

Opened without blocking (a FIFO would wait for a writer forever), checked on the open descriptor
(no path race: what is read is what was checked), and read to one byte past the limit at most, so
a file whose size says nothing of its content (``/proc``, a file growing as it is read) still
ends. A file that is missing or unreadable raises the ``OSError`` it always did. Where a pipe is
allowed (a recipe named on the command line: ``validate /dev/stdin``, ``<(envsubst < t.yaml)``),
it is read to its end, which a FIFO that no process writes has at once.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from clusterkit.errors import UserError

MiB = 1 << 20
CONFIG_LIMIT = 16 * MiB  # a file written by hand or by a job (a recipe, a profile, a model config, preflight.json)
RECORD_LIMIT = 1 * MiB  # a run record, an output folder's marker


class InputFileError(UserError):
    """A file clusterkit was given to read is no regular file, or larger than any such file can be:
    ``<path>: not a regular file (<what>)``."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or message  # the message without the path: "not a regular file"


def _refused(path: str | os.PathLike[str], problem: str, what: str) -> InputFileError:
    return InputFileError(f"{os.fspath(path)}: {problem} ({what})", problem)


def read_bounded(
    path: str | os.PathLike[str],
    limit: int,
    what: str,
    check: Callable[[os.stat_result], None] | None = None,
    tail: bool = False,
    pipe_ok: bool = False,
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; ``what`` names the file in
    the error (``"the run index"``). ``check`` is given the open file's status before anything is
    read, and may refuse it (raise). ``tail``: a larger file is no error, its last ``limit`` bytes
    are read (a log's end). ``pipe_ok``: a pipe or FIFO is read too, to its end."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)
        if pipe_ok and stat.S_ISFIFO(status.st_mode):
            # Blocking now: a read waits for the writer there is, and ends at once where there is none.
            os.set_blocking(descriptor, True)
        elif not stat.S_ISREG(status.st_mode):
            raise _refused(path, "not a regular file", what)
        if check is not None:
            check(status)
        too_large = _refused(path, f"larger than {_size_words(limit)}", what)
        if tail:
            os.lseek(descriptor, max(0, status.st_size - limit), os.SEEK_SET)
        elif status.st_size > limit:
            raise too_large
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, min(limit + 1 - size, MiB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if tail:
            return b"".join(chunks)[-limit:]  # grown since: still its last bytes
        if size > limit:
            raise too_large
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _size_words(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit >= MiB else f"{limit} bytes"

"""Ending a rank process whose work is done, without losing what it wrote.

A finished rank used to abort during interpreter exit ("terminate called without an active
exception", SIGABRT; about once in 30 two-node runs, every other time in a 4-rank DDP probe). Core
dump: ``destroy_process_group`` does not stop gloo's worker threads (they run on even after the
model is freed), and one of them was releasing a finished all-reduce work object whose saved
thread-local state holds a Python object; the decref waits for the GIL, which Python hands to no
thread during finalization: it ends that thread with ``pthread_exit``, whose forced unwind through
gloo's noexcept run loop calls std::terminate. :func:`finish` therefore does what a normal exit does
that matters (wait for foreground threads, run atexit handlers, flush every buffer) and then ends
the process with ``os._exit``, without finalization. Files the job's state is read from are written
durably (fsync) first, so a rank that has exited 0 has its results on disk."""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn


def fsync_file(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(directory: Path) -> None:
    """Flush every file under ``directory`` and the directory entries themselves to disk."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fsync_file(path)
    for folder in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
        fsync_file(folder)


def write_durably(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a whole (temporary name, fsync, rename): never half a file."""
    staging = path.with_name(f".{path.name}.tmp")
    with staging.open("w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(staging, path)
    fsync_file(path.parent)


def finish(code: int) -> NoReturn:
    """End the rank with ``code`` (only after its work returned normally; a raised error goes the
    usual way, through torchrun's @record error file)."""
    # As the interpreter's exit does, in its order: threading's exit hooks first (concurrent.futures'
    # tells its pools' idle workers to stop; torch.compile leaves such a pool behind), then the join
    # of every non-daemon thread (an upload still in progress). Joining first waits for ever.
    threading._shutdown()  # type: ignore[attr-defined]  (private, but what Py_FinalizeEx itself calls)
    # Python-level exit work: logging.shutdown, integrations' final writes (wandb, tensorboard),
    # worker pools (torch.compile, multiprocessing). Private, but the function exit itself calls.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio buffers (output of C/C++ libraries)
    os._exit(code)

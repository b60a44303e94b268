"""``clusterkit validate`` answered again without validating, while nothing it read has changed.

A validation is a function of what it reads: the recipes and every file they name, the folders it
looks into, the environment variables it asks for, the code that runs (clusterkit, its libraries,
the interpreter) and what it is asked (the arguments, the folder it runs in). A run records all of
these as it validates, and keeps the record with the exact output and exit status:

- every path it stats, opens or lists, with its status (mode, inode, device, size, mtime, ctime;
  a file rewritten with its old mtime put back still has a new ctime), or the error the lookup
  gave, so a file that appears where none was (a profile earlier on the search path, a user
  config) counts too. Each is taken *before* the read, so an edit during the run makes the
  record stale, never the answer. A status cannot tell two writes apart that fall within the
  file system's timestamp granularity (a clock tick; a second or two on some NFS servers and
  old file systems), so a run that read anything changed less than RACY_SECONDS before it
  started stores nothing (git's "racily clean" index entries, the same problem);
- every environment variable it reads, as a digest (no value is written to disk: some are
  secrets), or the whole environment's digest where it went through all of them;
- the files of the modules loaded and the folders of ``sys.path`` (an install or uninstall
  there changes the folder), with the Python version, the uid, the host name and the terminal.

A later run with the same arguments, folder and terminal checks each of them (a file or folder
that was read is opened again, see :func:`signature`) and, when all are as recorded, prints the
recorded output. Anything else, or a damaged entry, or one another user could have written,
validates as before. A run that did what a record cannot cover stores nothing: started a process
(``git`` for a snapshot), opened a socket, changed folder or the environment, wrote a file other
than a cache's or bytecode, wrote bytes to stdout beneath the text layer, or read something
whose status does not change with its content (a terminal, a pipe, a device, a file of /proc or
/sys). ``--no-cache`` validates and stores nothing. Submit never reads this: it validates.

Imports only modules the interpreter has loaded at start: this module is the whole of a replay.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import time
import zlib

from clusterkit.spec.user_cache import read_private, user_cache_root, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

try:  # the module hashlib takes it from, without OpenSSL's ~3 ms of start
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

ENTRY_FORMAT = 2
RACY_SECONDS = 2  # the coarsest timestamps in use: a second (ext3, many NFS servers), two (FAT)
KEEP_ENTRIES = 256  # validations of other recipes, folders or arguments; the oldest go first
_STORED_STATUSES = (0, 2)  # valid, or the recipe's errors (EXIT_USAGE); never a failure of this machine
_stat = os.stat  # the real one, while recording replaces os.stat
_HOOKED = "clusterkit.validate_cache.hooked"  # an audit event of ours: proves the hook is called
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = frozenset({"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime",
                           "os.truncate", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode",
                           "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.rmtree"})
_UNRECORDABLE = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "os.fork", "os.forkpty",
                 "pty.", "socket.", "os.chdir", "os.fchdir", "os.chroot", "os.putenv", "os.unsetenv", "ctypes.")


STAT, LSTAT, OPEN = 0, 1, 2  # how a path was looked at: what it points to, the link itself, or read


def signature(path: str | bytes, how: int = STAT) -> tuple | int:
    """What says a path is unchanged: its status, or the errno of looking it up. A file or folder
    that was read is opened to ask: on NFS, opening revalidates what a stat may take from the
    client's attribute cache (up to a minute old after an edit on another host), as the
    validation's own open did."""
    try:
        if how == OPEN:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            try:
                status = os.fstat(descriptor)
            finally:
                os.close(descriptor)
        else:
            status = _stat(path, follow_symlinks=how == STAT)
    except OSError as error:
        return error.errno or -1
    except ValueError:  # a NUL in the path: no lookup at all
        return -1
    return (status.st_mode, status.st_ino, status.st_dev, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def digest(value: str | bytes | None) -> bytes | None:
    if value is None:
        return None
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    return blake2b(data, digest_size=16).digest()


def environment_digest() -> bytes:
    return blake2b(repr(sorted(os.environ.items())).encode("utf-8", "surrogateescape"), digest_size=16).digest()


def request(arguments: list[str]) -> tuple:
    """What the output is a function of besides what the run reads: the question, where it is asked,
    by whom, by which interpreter and install, on which terminal."""
    terminal = []
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            terminal.append(tuple(os.get_terminal_size(stream.fileno())))  # marshal takes no terminal_size
        except (AttributeError, ValueError, OSError):  # not a terminal, or no stream at all
            terminal.append(None)
    return (ENTRY_FORMAT, __file__, sys.version, tuple(sys.flags), tuple(sys.path), tuple(arguments), os.getcwd(),
            os.getuid(), os.getgid(), os.uname().nodename, tuple(terminal))


def entry_path(key: tuple) -> str | None:
    root = user_cache_root()
    return None if root is None else os.path.join(root, f"validate-{zlib.crc32(repr(key).encode()):08x}")


def replay(arguments: list[str]) -> int | None:
    """Print the recorded output of the validation ``arguments`` ask for and return its status,
    when everything it read is as recorded; else None (then validate)."""
    try:
        key = request(arguments)
    except OSError:  # the folder we run in is gone
        return None
    path = entry_path(key)
    data = None if path is None else read_private(path)
    if data is None:
        return None
    try:
        entry = marshal.loads(data)
        if entry["key"] != key or not _unchanged(entry):
            return None
        output, status = entry["output"], entry["status"]
    except (EOFError, ValueError, TypeError, KeyError, AttributeError):  # damaged
        return None
    streams = {1: sys.stdout, 2: sys.stderr}
    for descriptor, text in output:
        streams[descriptor].write(text)  # a closed stream (None) printed nothing, so has no text here
    return status


def _unchanged(entry: dict) -> bool:
    whole = entry["whole_environment"]
    return ((whole is None or whole == environment_digest())
            and all(digest(os.environ.get(name)) == value for name, value in entry["environment"])
            and all(signature(path, how) == recorded for (path, how), recorded in entry["paths"]))


class Recording:
    """What one validation reads, as it runs: see the module's docstring."""

    def __init__(self) -> None:
        self.paths: dict[tuple[str | bytes, int], tuple | int | None] = {}
        self.environment: dict[str | bytes, bytes | None] = {}
        self.whole_environment: bytes | None = None
        self.refused: str | None = None  # why this run cannot be recorded
        self.output: list[tuple[int, str]] = []
        self.active = False
        self.hooked = False  # whether the audit hook sees the events
        self.started_ns = time.time_ns() - RACY_SECONDS * 1_000_000_000
        # Their files' status stays the same while what they read changes.
        self._dynamic_devices = {status[2] for status in map(signature, ("/proc", "/sys")) if isinstance(status, tuple)}
        root = user_cache_root()
        self._cache_root = None if root is None else os.path.join(root, "")

    def path(self, path: object, how: int = STAT) -> None:
        if isinstance(path, int):  # a descriptor: its file was recorded when opened
            return
        try:
            name = os.fspath("." if path is None else path)
        except TypeError:  # not a path at all: the call itself fails
            return
        if (name, how) in self.paths:
            return
        self.paths[name, how] = None  # the open that asks is audited too: this is what it finds
        recorded = self.paths[name, how] = signature(name, how)
        if isinstance(recorded, tuple):
            mode, _, device, _, mtime_ns, ctime_ns = recorded
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)) or device in self._dynamic_devices:
                self.refused = f"read {os.fsdecode(name)}, whose status does not follow its content"
            elif max(mtime_ns, ctime_ns) >= self.started_ns:
                self.refused = f"read {os.fsdecode(name)}, changed too recently to tell from a later change"

    def written(self, path: object) -> None:
        """A write: the caches' own (the TrainingArguments names, this entry) and bytecode are derived
        and need not happen again; any other is an effect a replay would not have."""
        try:
            text = os.fsdecode(path)
        except TypeError:  # a descriptor
            self.refused = "wrote to a descriptor"
            return
        absolute = os.path.abspath(text)
        if os.path.basename(os.path.dirname(absolute)) == "__pycache__":
            return
        if self._cache_root is not None and absolute.startswith(self._cache_root):
            return
        self.refused = f"wrote {text}"

    def audit(self, event: str, arguments: tuple) -> None:
        if event == _HOOKED:
            self.hooked = True
        if not self.active:
            return
        if event == "open":
            path, mode, flags = arguments
            if flags & _WRITE_FLAGS or mode is not None and any(letter in mode for letter in "wax+"):
                self.written(path)
            else:
                self.path(path, OPEN)
        elif event in ("os.listdir", "os.scandir"):
            self.path(arguments[0], OPEN)
        elif event in _WRITE_EVENTS:
            self.written(arguments[0])
        elif event.startswith(_UNRECORDABLE):
            self.refused = event

    def variable(self, name: str | bytes, value: str | bytes | None) -> None:
        if self.active and name not in self.environment:
            self.environment[name] = digest(value)

    def every_variable(self) -> None:
        if self.active and self.whole_environment is None:
            self.active = False  # the digest goes through the environment too
            try:
                self.whole_environment = environment_digest()
            finally:
                self.active = True


_active: Recording | None = None


def refuse(reason: str) -> None:
    """Store nothing of this run (``validate --no-cache``)."""
    if _active is not None:
        _active.refused = reason


class _Recorded:
    """A text stream whose writes are also kept (stdout or stderr while recording)."""

    def __init__(self, stream, descriptor: int, recording: Recording) -> None:
        self._stream, self._descriptor, self._recording = stream, descriptor, recording

    def write(self, text: str) -> int:
        self._recording.output.append((self._descriptor, text))
        return self._stream.write(text)

    def __getattr__(self, name: str):
        if name in ("buffer", "detach", "writelines"):  # bytes or lines we would not see
            self._recording.refused = f"used {name} of a standard stream"
        return getattr(self._stream, name)


def _recording_os(recording: Recording) -> dict:
    """os.stat, os.lstat and os.access that also record (they have no audit event), and the
    environment's reads; returned as what to put back."""
    environ_type = type(os.environ)
    saved = {(os, "stat"): os.stat, (os, "lstat"): os.lstat, (os, "access"): os.access,
             (environ_type, "__getitem__"): environ_type.__getitem__,
             (environ_type, "__iter__"): environ_type.__iter__, (environ_type, "__len__"): environ_type.__len__}

    def looked_up(function: Callable, follows: bool = True) -> Callable:
        def wrapper(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                recording.refused = "a lookup relative to a descriptor"
            recording.path(path, STAT if follows and kwargs.get("follow_symlinks", True) else LSTAT)
            return function(path, *args, **kwargs)
        return wrapper

    def getitem(environ, name):
        try:
            value = saved[environ_type, "__getitem__"](environ, name)
        except KeyError:
            recording.variable(name, None)
            raise
        recording.variable(name, value)
        return value

    def iterate(environ):
        recording.every_variable()
        return saved[environ_type, "__iter__"](environ)

    def length(environ):
        recording.every_variable()
        return saved[environ_type, "__len__"](environ)

    os.stat, os.lstat, os.access = looked_up(os.stat), looked_up(os.lstat, follows=False), looked_up(os.access)
    environ_type.__getitem__, environ_type.__iter__, environ_type.__len__ = getitem, iterate, length
    return saved


def validate(arguments: list[str], run: Callable[[list[str]], int]) -> int:
    """``run(arguments)`` (the validation), recorded and stored for the next identical request."""
    try:
        key = request(arguments)
    except OSError:
        return run(arguments)
    path = entry_path(key)
    if path is None:
        return run(arguments)
    recording = Recording()
    for module in list(sys.modules.values()):  # the code already loaded; what loads later is opened
        if getattr(module, "__file__", None):
            recording.path(module.__file__)
    for folder in sys.path:
        recording.path(folder or ".")
    sys.addaudithook(recording.audit)  # cannot be removed: it records only while active
    sys.audit(_HOOKED)
    if not recording.hooked:  # a hook already there refused ours (addaudithook says nothing then)
        return run(arguments)
    saved = _recording_os(recording)
    streams = sys.stdout, sys.stderr
    # A stream the shell closed (`>&-`) is None, which print() writes nothing to: left as it is.
    sys.stdout, sys.stderr = (None if stream is None else _Recorded(stream, descriptor, recording)
                              for descriptor, stream in ((1, sys.stdout), (2, sys.stderr)))
    global _active
    recording.active, _active = True, recording
    try:
        status = run(arguments)
    finally:
        recording.active, _active = False, None
        sys.stdout, sys.stderr = streams
        for (owner, name), function in saved.items():
            setattr(owner, name, function)
    if status in _STORED_STATUSES and recording.refused is None:
        _store(path, key, recording, status)
    return status


def _store(path: str, key: tuple, recording: Recording, status: int) -> None:
    write_private(path, marshal.dumps({
        "key": key, "status": status, "output": recording.output, "paths": list(recording.paths.items()),
        "environment": list(recording.environment.items()), "whole_environment": recording.whole_environment}))
    _prune(os.path.dirname(path))


def _prune(folder: str) -> None:
    """Keep the newest KEEP_ENTRIES validations (one per recipe, folder and arguments asked about)."""
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name.startswith("validate-")]
        if len(entries) <= KEEP_ENTRIES:
            return
        entries.sort(key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
        for entry in entries[KEEP_ENTRIES:]:
            os.unlink(entry.path)
    except OSError:  # another run pruned it first
        pass

"""Compiled templates kept on disk, so that a render skips Jinja's parser and compiler (~25 ms of
every ``clusterkit render`` or ``submit``) while the template's text is unchanged.

An entry is keyed by the template's name and file and checked against a checksum of its source, so
an edited or ops template is compiled again. What it does not key is the Environment's syntax
options, on which the compiled code also depends: the folder is named after them and the Python and
Jinja versions. An entry is code the render runs, so it is read only from a private cache
(:mod:`clusterkit.spec.user_cache`), and in a format of our own rather than Jinja's, which pickles
(unpickling runs whatever the bytes say): a header line (format, Python and Jinja versions, the
source's checksum, a digest of the rest), then the code as ``marshal`` wrote it. The cache is an
optimisation only: an entry that is missing, not private, damaged or of another version means
compiling as if it were not there.
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from types import CodeType

import jinja2
from jinja2.bccache import Bucket

from clusterkit.spec.user_cache import read_entry, write_entry

_FORMAT = f"clusterkit-template 1 python {sys.hexversion:x} jinja2 {jinja2.__version__}"


class TemplateCache(jinja2.BytecodeCache):
    def __init__(self, folder: str) -> None:
        self.folder = folder  # in the user cache

    def load_bytecode(self, bucket: Bucket) -> None:
        entry = read_entry(self.folder, _entry_name(bucket))
        if entry is None:
            return
        header, _, code = entry.partition(b"\n")
        if header != _header(bucket, code):  # another version or source, or damaged
            return
        try:
            loaded = marshal.loads(code)
        except (EOFError, ValueError, TypeError):
            return
        if isinstance(loaded, CodeType):
            bucket.code = loaded

    def dump_bytecode(self, bucket: Bucket) -> None:
        code = marshal.dumps(bucket.code)
        write_entry(self.folder, _entry_name(bucket), _header(bucket, code) + b"\n" + code)


def _entry_name(bucket: Bucket) -> str:
    return f"{bucket.key}.cache"  # the key: a hex digest of the template's name and file


def _header(bucket: Bucket, code: bytes) -> bytes:
    return f"{_FORMAT} {bucket.checksum} {hashlib.sha256(code).hexdigest()}".encode()


def template_cache(syntax: dict[str, object]) -> TemplateCache:
    """The cache for templates compiled with these Environment ``syntax`` options."""
    options = sorted((name, getattr(value, "__qualname__", value)) for name, value in syntax.items())
    tag = hashlib.sha256(repr((_FORMAT, options)).encode()).hexdigest()[:16]
    return TemplateCache(f"templates-{tag}")

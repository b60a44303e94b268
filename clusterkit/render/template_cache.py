"""Compiled templates kept on disk, so that a render skips Jinja's parser and compiler (~25 ms of
every ``clusterkit render`` or ``submit``) while the template's text is unchanged.

An entry is keyed by the template's name and file and checked against a checksum of its source, so
an edited or ops template is compiled again. What it does not key is the Environment's syntax
options, on which the compiled code also depends: the folder is named after them and the Jinja
version. Writes are atomic (Jinja writes a temporary file and renames it), so concurrent renders
read whole entries or none. The cache is an optimisation only: a folder that cannot be written or an
entry that cannot be read (corrupt, truncated, another Python) means compiling as if it were not there.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket

from clusterkit.spec.user_cache import user_cache_dir


class TemplateCache(jinja2.FileSystemBytecodeCache):
    def __init__(self, directory: Path) -> None:
        super().__init__(str(directory))
        self.path = directory

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # unpickling a damaged entry raises any of a dozen kinds: none is the user's problem
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:  # read-only, full or missing home: the next render compiles again
            pass


def template_cache(syntax: dict[str, object]) -> TemplateCache | None:
    """The cache for templates compiled with these Environment ``syntax`` options; None where
    there is no user cache folder."""
    root = user_cache_dir()
    if root is None:
        return None
    options = sorted((name, getattr(value, "__qualname__", value)) for name, value in syntax.items())
    tag = hashlib.sha256(repr((jinja2.__version__, options)).encode()).hexdigest()[:16]
    return TemplateCache(root / f"templates-{tag}")

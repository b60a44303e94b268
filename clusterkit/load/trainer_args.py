"""The keywords ``transformers.TrainingArguments`` accepts, and the kind of value each takes where
its annotation is one scalar type, read from its source with ``ast``: importing transformers costs
seconds, and validate must start fast on a login node. Cached on disk as JSON, in the private user
cache (:mod:`clusterkit.spec.user_cache`: a forged entry would make validate accept unknown keys),
keyed by the source file's path, size and modification time.

TrainingArguments converts nothing: ``learning_rate: "3e-4"`` is kept as text and only the
optimizer, in the job, refuses it. So validate checks the values of the ``bool``, ``int`` and
``float`` fields (each may also be ``X | None``); unions, enums and containers are left to it."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from pathlib import Path

from clusterkit.spec.user_cache import read_entry, write_entry

_CLASS = "TrainingArguments"
_SCALARS = ("bool", "int", "float")
_CACHE_ENTRY = "training_args.json"
_FORMAT = 2  # of the cache entry: 1 held names only
# What a kind says to the user ("float?": a number or null).
_KIND_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number"}


def _source_file() -> Path | None:
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "training_args.py"


def _fields_in(source: str) -> dict[str, str | None]:
    """The dataclass fields of TrainingArguments (``field(init=False)`` ones are no keywords), each
    with its kind (:func:`_kind`)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == _CLASS:
            return {
                statement.target.id: _kind(statement.annotation)
                for statement in node.body
                if isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and not _init_false(statement.value)
            }
    raise ValueError(f"no class {_CLASS}")


def _kind(annotation: ast.expr) -> str | None:
    """ "float" for ``float``, "float?" for ``float | None`` or ``Optional[float]`` (the same for
    bool and int); None for any other annotation (not checked)."""
    if isinstance(annotation, ast.Name) and annotation.id in _SCALARS:
        return annotation.id
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        others = [side for side in sides if not (isinstance(side, ast.Constant) and side.value is None)]
        inner = _kind(others[0]) if len(others) == 1 else None
    elif (
        isinstance(annotation, ast.Subscript)
        and isinstance(annotation.value, ast.Name)
        and annotation.value.id == "Optional"
    ):
        inner = _kind(annotation.slice)
    else:
        return None
    return f"{inner}?" if inner in _SCALARS else None


def misfit(value: object, kind: str | None) -> str | None:
    """Why ``value`` is no value of a field of this kind, or None when it is (or is not checked)."""
    if kind is None or value is None and kind.endswith("?"):
        return None
    base = kind.rstrip("?")
    fits = (
        isinstance(value, bool)
        if base == "bool"
        else (not isinstance(value, bool) and isinstance(value, int if base == "int" else (int, float)))
    )
    if fits:
        return None
    expected = _KIND_WORDS[base] + (" or null" if kind.endswith("?") else "")
    if isinstance(value, str):
        hint = " (in quotes it is text: write it without them)" if _reads_as(value, base) else ""
        return f"expected {expected}, got the text {value!r}{hint}"
    if isinstance(value, float) and base == "int" and value.is_integer():
        return f"expected {expected}, got {value!r} (write {int(value)})"
    shown = (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    )  # as YAML writes it
    return f"expected {expected}, got {shown}"


def _init_false(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
    )


def _reads_as(text: str, base: str) -> bool:
    """Whether ``text`` unquoted would be a value of this kind."""
    if base == "bool":
        return text in ("true", "false")
    try:
        number = float(text)
    except ValueError:
        return False
    return base == "float" or number.is_integer() and "." not in text and "e" not in text.lower()


@functools.lru_cache(maxsize=1)
def training_arguments() -> dict[str, str | None] | str:
    """Each accepted keyword with its kind, or why they are unknown here (a short reason)."""
    path = _source_file()
    if path is None:
        return "transformers not installed here"
    try:
        stat = path.stat()
        key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
        cached = _read_cache(key)
        if cached is not None:
            return cached
        fields = _fields_in(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as exc:
        return f"cannot read {path}: {exc}"
    _write_cache(key, fields)
    return fields


def _read_cache(key: str) -> dict[str, str | None] | None:
    entry = read_entry("", _CACHE_ENTRY)
    try:
        data = json.loads(entry) if entry is not None else None
    except (ValueError, RecursionError):  # damaged (nested too deep, not UTF-8, not JSON)
        return None
    if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("key") != key:
        return None
    fields = data.get("fields")
    if not isinstance(fields, dict) or not all(
        kind is None or isinstance(kind, str) and kind.rstrip("?") in _SCALARS for kind in fields.values()
    ):
        return None  # damaged, or written by another clusterkit
    return fields


def _write_cache(key: str, fields: dict[str, str | None]) -> None:
    """Best effort: a read-only home only costs the next run the parse (~40 ms)."""
    write_entry(
        "", _CACHE_ENTRY, json.dumps({"format": _FORMAT, "key": key, "fields": fields}, sort_keys=True).encode()
    )

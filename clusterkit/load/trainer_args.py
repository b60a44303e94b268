"""The keyword names ``transformers.TrainingArguments`` accepts, read from its source with ``ast``:
importing transformers costs seconds, and validate must start fast on a login node. The names are
cached on disk, keyed by the source file's path, size and modification time."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
from pathlib import Path

from clusterkit.spec.user_cache import user_cache_dir

_CLASS = "TrainingArguments"


def _cache_file() -> Path | None:
    root = user_cache_dir()
    return root / "training_args.json" if root else None


def _source_file() -> Path | None:
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "training_args.py"


def _fields_in(source: str) -> list[str]:
    """The dataclass fields of TrainingArguments (``field(init=False)`` ones are no keywords)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == _CLASS:
            return [statement.target.id for statement in node.body
                    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and not _init_false(statement.value)]
    raise ValueError(f"no class {_CLASS}")


def _init_false(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and any(
        k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords)


@functools.lru_cache(maxsize=1)
def training_argument_names() -> frozenset[str] | str:
    """The accepted names, or why they are unknown here (a short reason)."""
    path = _source_file()
    if path is None:
        return "transformers not installed here"
    try:
        stat = path.stat()
        key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
        cached = _read_cache(key)
        if cached is not None:
            return cached
        names = frozenset(_fields_in(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError) as exc:
        return f"cannot read {path}: {exc}"
    _write_cache(key, names)
    return names


def _read_cache(key: str) -> frozenset[str] | None:
    path = _cache_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("names"), list):
        return None
    return frozenset(str(name) for name in data["names"])


def _write_cache(key: str, names: frozenset[str]) -> None:
    """Best effort: a read-only home only costs the next run the parse (~40 ms)."""
    import tempfile  # here: validate reads the cache, and tempfile's imports cost ~2 ms of its start

    target = _cache_file()
    if target is None:
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".training_args.", delete=False) as out:
            json.dump({"key": key, "names": sorted(names)}, out)
        os.replace(out.name, target)
    except OSError:
        pass

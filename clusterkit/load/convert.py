"""Plain data (a recipe, a cluster profile, the user config) converted to its typed spec, with
msgspec's validation error worded as a recipe error: ``file:line: key.path: message``, an unknown
key with its likely meaning and the valid ones, a pattern said as the format it stands for."""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec

from clusterkit.errors import Finding, RecipeError
from clusterkit.load.yaml_source import SourceMap
from clusterkit.spec.recipe import PATTERN_HINTS

_T = typing.TypeVar("_T")
_ERROR_AT = re.compile(r"^(?P<message>.*?)(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def convert(data: Any, target: type[_T], source: SourceMap) -> _T:
    try:
        return msgspec.convert(data, target, strict=True)
    except msgspec.ValidationError as exc:
        raise RecipeError(_finding_from_validation(str(exc), target, source, data)) from None


def _finding_from_validation(text: str, root: type, source: SourceMap, data: Any = None) -> Finding:
    match = _ERROR_AT.match(text)
    assert match is not None  # the pattern matches any string
    message, raw_path = match.group("message"), match.group("path") or ""
    unknown = re.match(r"Object contains unknown field `(.*)`", message)
    missing = re.match(r"Object missing required field `(.*)`", message)
    path: list[str | int] = []
    for name, index in _PATH_PART.findall(raw_path):
        if index == "...":
            # msgspec does not say which entry of a mapping failed; for a bad key in an entry's own
            # mapping (env: {X: {prefix: ...}}) the data does.
            entry = _entry_with_key(data, path, (unknown or missing).group(1)) if unknown or missing else None
            if entry is None:
                break
            path.append(entry)
            continue
        path.append(name if name else int(index))
    if unknown:
        key = unknown.group(1)
        choices = _struct_fields(root, path)
        from difflib import get_close_matches  # an error's suggestion; a valid recipe needs no difflib

        close = get_close_matches(key, choices, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        message = f"unknown key '{key}'; {hint}valid keys: {', '.join(choices)}"
        path.append(key)
    elif missing:
        message = f"required key '{missing.group(1)}' is missing"
        path.append(missing.group(1))
    elif "matching regex" in message:
        # msgspec quotes the pattern as Python's repr does
        pattern = message.split("matching regex ", 1)[1].strip("'").replace("\\\\", "\\")
        message = f"must be {PATTERN_HINTS.get(pattern, 'text matching ' + pattern)}"
    elif message.startswith("Expected `") and (pattern := _pattern_at(root, path)) in PATTERN_HINTS:
        # A number or a list where text of a format was meant (mem: 4.5, time: true): say the format.
        got = re.search(r"got `(\w+)`", message)
        if got is None:  # a number out of range (time: 0)
            message = f"must be {PATTERN_HINTS[pattern]}; {message[0].lower()}{message[1:]}"
        else:
            quote = " (quote it to make it text)" if got[1] in ("int", "float", "bool") else ""
            message = f"must be {PATTERN_HINTS[pattern]}, not {_KINDS.get(got[1], got[1])}{quote}"
    elif message.startswith("Invalid enum value") and (choices := _choices_at(root, path)):
        message = f"{message}; valid: {', '.join(map(str, choices))}"
    return Finding(source.locate(tuple(path)), tuple(path), message)


# msgspec's names of what a value was, as a recipe's reader knows them.
_KINDS = {
    "int": "a whole number",
    "float": "a decimal number",
    "bool": "true/false",
    "array": "a list",
    "object": "a mapping",
    "null": "empty",
}


def _pattern_at(root: Any, path: list[str | int]) -> str | None:
    """The pattern of the text field at ``path`` (of a text field that also takes a number, as
    resources.time does); None for a list or mapping of patterned text, or a field with none."""
    current: Any = root
    for part in path:
        current = _descend(current, part)
    return _pattern_of(current)


def _pattern_of(annotation: Any) -> str | None:
    if typing.get_origin(annotation) in (list, dict):
        return None
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta) and meta.pattern:
            return meta.pattern
    return next(filter(None, map(_pattern_of, typing.get_args(annotation))), None)


def _choices_at(root: Any, path: list[str | int]) -> tuple[Any, ...]:
    """The values a Literal field at ``path`` takes (none where it is not one)."""
    current: Any = root
    for part in path:
        current = _descend(current, part)
    return _literal_values(current)


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return next(filter(None, map(_literal_values, typing.get_args(annotation))), ())


def _entry_with_key(data: Any, path: list[str | int], key: str) -> str | None:
    """The first entry of the mapping at ``path`` in ``data`` whose value is a mapping holding (for
    an unknown key) or lacking (for a missing one) ``key``; None when no single entry says so."""
    node = data
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    if not isinstance(node, dict):
        return None
    found = [name for name, value in node.items() if isinstance(value, dict) and key in value]
    return found[0] if len(found) == 1 else None


def _struct_fields(root: Any, path: list[str | int]) -> list[str]:
    """Field names of the struct found by following ``path`` through ``root``'s type annotations."""
    current: Any = root
    for part in path:
        current = _descend(current, part)
        if current is None:
            return []
    struct = _find_struct(current)
    return list(struct.__struct_fields__) if struct else []


def _find_struct(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    for arg in typing.get_args(annotation):
        found = _find_struct(arg)
        if found:
            return found
    return None


def _descend(annotation: Any, part: str | int) -> Any:
    struct = _find_struct(annotation)
    if isinstance(part, str) and struct is not None:
        return typing.get_type_hints(struct, include_extras=True).get(part)
    for arg in typing.get_args(annotation):  # list[T] / dict[K, V]: the element type
        if typing.get_origin(arg) in (list, dict):
            return typing.get_args(arg)[-1]
    if typing.get_origin(annotation) in (list, dict):
        return typing.get_args(annotation)[-1]
    return None

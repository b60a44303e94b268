"""YAML loading that remembers the line of every key, so errors can point at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clusterkit.errors import Finding, Location, RecipeError

try:  # libyaml is ~10x faster; fall back to the pure-Python loader where it is missing.
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

KeyPath = tuple[str | int, ...]
# Maximum nesting accepted in a recipe; deeper documents are hostile or broken, not recipes.
MAX_DEPTH = 32


class SourceMap:
    """Maps key paths to the place each value was written (file and line)."""

    def __init__(self, default: Location):
        self.default = default
        self._locations: dict[KeyPath, Location] = {}

    def set(self, path: KeyPath, location: Location) -> None:
        self._locations[path] = location

    def drop_below(self, path: KeyPath) -> None:
        """Forget locations under ``path`` (the value there was replaced whole)."""
        n = len(path)
        for key in [k for k in self._locations if len(k) > n and k[:n] == path]:
            del self._locations[key]

    def update(self, other: "SourceMap") -> None:
        self._locations.update(other._locations)

    def locate(self, path: KeyPath) -> Location:
        """The location of ``path``, or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            found = self._locations.get(tuple(path[:n]))
            if found is not None:
                return found
        return self.default


def load_yaml_file(path: Path) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return plain Python data and its source map.

    Duplicate keys are errors (plain ``yaml.safe_load`` silently keeps the last one).
    """
    display = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(Finding(Location(display), (), "file not found")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(Finding(Location(display), (), f"cannot read: {exc}")) from None
    return parse_yaml_text(text, display)


def parse_yaml_text(text: str, display: str) -> tuple[Any, SourceMap]:
    source = SourceMap(Location(display, 1))
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = _build(loader, node, (), source, display, 0) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError(Finding(Location(display, line), (), f"invalid YAML: {exc.problem}")) from None
    except yaml.YAMLError as exc:
        raise RecipeError(Finding(Location(display), (), f"invalid YAML: {exc}")) from None
    finally:
        loader.dispose()
    return data, source


def _build(loader: Any, node: yaml.Node, path: KeyPath, source: SourceMap, display: str, depth: int) -> Any:
    location = Location(display, node.start_mark.line + 1)
    if depth > MAX_DEPTH:
        raise RecipeError(Finding(location, path, f"nested deeper than {MAX_DEPTH} levels"))
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves YAML merge keys (<<)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            key_location = Location(display, key_node.start_mark.line + 1)
            if not isinstance(key, str):
                raise RecipeError(Finding(key_location, path, f"keys must be strings, got {key!r}"))
            if key in result:
                raise RecipeError(Finding(key_location, path + (key,), "duplicate key"))
            source.set(path + (key,), key_location)
            result[key] = _build(loader, value_node, path + (key,), source, display, depth + 1)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            source.set(path + (index,), Location(display, item.start_mark.line + 1))
            items.append(_build(loader, item, path + (index,), source, display, depth + 1))
        return items
    try:
        return loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        raise RecipeError(Finding(location, path, f"invalid value: {exc}")) from None

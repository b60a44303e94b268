"""YAML loading that remembers the line of every key, so errors can point at it.

Two YAML 1.1 surprises are switched off: ``12:00`` is not the base-60 number 720 (it stays the
text, which SLURM reads as 12 minutes), and an environment value keeps the text written (``3.10``
stays ``3.10``, ``yes`` stays ``yes``; only ``true``/``false`` stay booleans, exported as 1/0).
Alias expansion is capped, so a "billion laughs" document fails at once instead of hanging.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from clusterkit.errors import Finding, Location, RecipeError
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded

try:  # libyaml is ~10x faster; fall back to the pure-Python loader where it is missing.
    _BaseLoader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _BaseLoader = yaml.SafeLoader

KeyPath = tuple[str | int, ...]
# Maximum nesting accepted in a recipe; deeper documents are hostile or broken, not recipes.
MAX_DEPTH = 32
# Values built from one document, aliases expanded. A real recipe has a few hundred; more is an
# alias bomb ("billion laughs": 1 KB of nested aliases expanding to 10^9 values).
MAX_VALUES = 100_000
# YAML 1.1 base-60 numbers: `12:00` → 720, `1:30:00` → 5400 (YAML 1.2 dropped them).
SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
# PyYAML's YAML 1.1 int and float patterns without their base-60 alternatives, and floats as YAML
# 1.2 and Python write them: `3e-4` and `1e5` are numbers (YAML 1.1 wants a dot and a signed
# exponent, `3.0e-4`, and reads `3e-4` as a string, which TrainingArguments takes and the optimizer
# then refuses in the job). A float needs a dot or an exponent: PyYAML tries floats before ints.
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_WITHOUT_BASE_60 = {"tag:yaml.org,2002:int": _INT, "tag:yaml.org,2002:float": _FLOAT}
# Mappings whose values are environment variables: their plain scalars keep the text as written.
_ENV_MAPPINGS = {("env",), ("network", "env"), ("network_env",)}
_BOOLEANS = ("true", "false")  # YAML 1.2's only booleans


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """The safe loader without base-60 numbers."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, _WITHOUT_BASE_60.get(tag, rx)) for tag, rx in resolvers]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


class SourceMap:
    """Maps key paths to the place each value was written (file and line), and keeps the warnings
    found while reading (an unquoted ``12:00``)."""

    def __init__(self, default: Location):
        self.default = default
        self._locations: dict[KeyPath, Location] = {}
        self.warnings: list[Finding] = []

    def set(self, path: KeyPath, location: Location) -> None:
        self._locations[path] = location

    def written(self, path: KeyPath) -> bool:
        """Whether ``path`` or a key below it was written (in a file or an override), not only an ancestor."""
        n = len(path)
        return any(key[:n] == tuple(path) for key in self._locations)

    def drop_below(self, path: KeyPath) -> None:
        """Forget locations under ``path`` (the value there was replaced whole)."""
        n = len(path)
        for key in [k for k in self._locations if len(k) > n and k[:n] == path]:
            del self._locations[key]

    def update(self, other: SourceMap) -> None:
        self._locations.update(other._locations)

    def locate(self, path: KeyPath) -> Location:
        """The location of ``path``, or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            found = self._locations.get(tuple(path[:n]))
            if found is not None:
                return found
        return self.default


def load_yaml_file(path: Path, pipe_ok: bool = False) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return plain Python data and its source map. A regular file only,
    of at most CONFIG_LIMIT bytes (``pipe_ok``: or a pipe, to its end).

    Duplicate keys are errors (plain ``yaml.safe_load`` silently keeps the last one).
    """
    display = str(path)
    try:
        text = read_bounded(path, CONFIG_LIMIT, "a YAML file", pipe_ok=pipe_ok).decode("utf-8")
    except FileNotFoundError:
        raise RecipeError(Finding(Location(display), (), "file not found")) from None
    except InputFileError as exc:
        raise RecipeError(Finding(Location(display), (), exc.problem)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(Finding(Location(display), (), f"cannot read: {exc}")) from None
    return parse_yaml_text(text, display)


def parse_yaml_text(text: str, display: str, root: KeyPath = (), line: int | None = 1) -> tuple[Any, SourceMap]:
    """Parse ``text``; ``root`` is the key path the document sits at (a ``--set`` value's key) and
    ``line`` None reports every location as ``display`` alone (no file line to point at)."""
    source = SourceMap(Location(display, line))
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = _Builder(loader, source, display, line is not None).build(node, root) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise RecipeError(
            Finding(Location(display, mark.line + 1 if mark and line else None), (), f"invalid YAML: {exc.problem}")
        ) from None
    except yaml.YAMLError as exc:
        raise RecipeError(Finding(Location(display), (), f"invalid YAML: {exc}")) from None
    finally:
        loader.dispose()
    return data, source


class _Builder:
    """Builds plain data from the node graph, recording each key's line and counting values."""

    def __init__(self, loader: Any, source: SourceMap, display: str, with_lines: bool):
        self.loader, self.source, self.display, self.with_lines = loader, source, display, with_lines
        self.values = 0

    def location(self, node: yaml.Node) -> Location:
        return Location(self.display, node.start_mark.line + 1 if self.with_lines else None)

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        location = self.location(node)
        self.values += 1
        if self.values > MAX_VALUES:
            raise RecipeError(
                Finding(
                    location,
                    path,
                    f"more than {MAX_VALUES} values once aliases are expanded "
                    "(an alias bomb?); a recipe is far smaller",
                )
            )
        if len(path) > MAX_DEPTH:
            raise RecipeError(Finding(location, path, f"nested deeper than {MAX_DEPTH} levels"))
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.source.set(path + (index,), self.location(item))
                items.append(self.build(item, path + (index,)))
            return items
        return self.scalar(node, path, location)

    def mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        self.loader.flatten_mapping(node)  # resolves YAML merge keys (<<)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key_location = self.location(key_node)
            if not isinstance(key_node, yaml.ScalarNode):  # constructing it could expand an alias bomb
                raise RecipeError(Finding(key_location, path, "keys must be strings, got a collection"))
            key = self.loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise RecipeError(Finding(key_location, path, f"keys must be strings, got {key!r}"))
            if key in result:
                raise RecipeError(Finding(key_location, path + (key,), "duplicate key"))
            self.source.set(path + (key,), key_location)
            result[key] = self.build(value_node, path + (key,))
        return result

    def scalar(self, node: yaml.ScalarNode, path: KeyPath, location: Location) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise RecipeError(Finding(location, path, f"invalid value: {exc}")) from None
        plain = not node.style  # libyaml says '' for a plain scalar, PyYAML None
        # The script gets the text written: 3.10, not 3.1; yes, not True (also in an edit's prepend/append).
        step_env = len(path) == 4 and path[0] == "steps" and path[2] == "env"  # a step's env (spec.recipe.JobStep)
        if step_env or path[:-1] in _ENV_MAPPINGS or path[:-2] in _ENV_MAPPINGS and path[-1] in ("prepend", "append"):
            if value is None and node.value in ("null", "Null", "NULL", "~") and path[:-1] in _ENV_MAPPINGS:
                return None  # unset the variable (one a cluster profile sets, too)
            if value is None:
                raise RecipeError(
                    Finding(
                        location,
                        path,
                        "an environment value cannot be empty; write '' for an "
                        "empty value, or null to unset the variable",
                    )
                )
            # true/false stay booleans (exported as 1/0); yes/no/on/off are YAML 1.1 only: text.
            return value if not plain or isinstance(value, bool) and node.value.lower() in _BOOLEANS else node.value
        if plain and isinstance(value, str) and SEXAGESIMAL.match(value):
            self.source.warnings.append(Finding(location, path, _sexagesimal_note(value, path), "warning"))
        return value


def _sexagesimal_note(text: str, path: KeyPath) -> str:
    if path and path[-1] in ("time", "max_time"):
        parts = text.split(":")
        meaning = f"{parts[0]} min {parts[1]} s" if len(parts) == 2 else f"{parts[0]} h {parts[1]} min {parts[2]} s"
        return (
            f"{text} is read as the SLURM time '{text}' ({meaning}; YAML 1.1 would make it a base-60 number); "
            f'quote it ("{text}") to say so'
        )
    return f"{text} is kept as the text '{text}' (YAML 1.1 would make it a base-60 number); quote it to say so"

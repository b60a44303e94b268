"""Load a recipe file into a validated :class:`~clusterkit.spec.resolved.ResolvedRecipe`.

Order: read YAML (remembering lines) → merge ``extends`` bases → apply ``--set`` overrides →
check the schema → make local paths absolute → fill defaults from the cluster profile and derive
dp and batch sizes → layout checks. Any problem raises :class:`~clusterkit.errors.RecipeError` naming file, line and key path.
"""

from __future__ import annotations

import copy
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from clusterkit.errors import Finding, Location, RecipeError, RecipeErrors, UsageError
from clusterkit.load import checks, model_checks, step_checks
from clusterkit.load.convert import convert
from clusterkit.load.hub_cache import hub_cache_findings
from clusterkit.load.paths import CLUSTER_PREFIX, OVERRIDE_PREFIX, resolve_local_paths
from clusterkit.load.snapshot import resolve_snapshot
from clusterkit.load.user_config import fill_recipe_defaults, load_user_config
from clusterkit.load.yaml_source import KeyPath, SourceMap, load_yaml_file, parse_yaml_text
from clusterkit.spec.profile import BUILTIN_CLUSTERS_DIR, ClusterProfile, available_profiles, expanded, find_profile
from clusterkit.spec.recipe import Recipe
from clusterkit.spec.resolved import ResolvedRecipe

_MAX_EXTENDS_DEPTH = 16
BUILTIN_RECIPES_DIR = BUILTIN_CLUSTERS_DIR.parent  # clusterkit.recipes: the examples, their profiles in clusters/


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe with every default and derived value filled in, plus where it came from."""

    recipe: ResolvedRecipe
    profile: ClusterProfile
    path: Path
    source: SourceMap
    profile_path: Path
    profile_source: SourceMap
    warnings: list[Finding] = field(default_factory=list)
    overrides: tuple[str, ...] = ()  # every override as key.path=value text (the run record keeps them)
    # The model's architecture numbers when a local config is known (layers, heads, hidden...).
    model_config: dict[str, Any] | None = None

    def locate(self, key_path: KeyPath) -> Location:
        return self.source.locate(key_path)


@dataclass(frozen=True)
class Override:
    """One recipe value set from outside the file: ``--set key.path=value`` parsed, or set by
    clusterkit itself (--resume, --cluster, bench's scales) as a typed value, never as text to parse."""

    key_path: KeyPath
    value: Any
    given_as: str | None = None  # the option that gave it, as an error's location (--cluster X); None: --set
    append: bool = False  # a list's items added after the list's own (``key.path+=[...]``)

    def __str__(self) -> str:
        """``key.path=value``, with the value as JSON (which YAML reads back as the same value)."""
        return ".".join(map(str, self.key_path)) + ("+=" if self.append else "=") + _yaml_json(self.value)


# What YAML reads as written in a double-quoted scalar (its printable set, without its line breaks);
# anything else is escaped. JSON's own \ud83d\ude00 for a character above U+FFFF is no YAML escape.
_NOT_YAML_PRINTABLE = re.compile(
    "[^\t\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def _yaml_json(value: Any) -> str:
    """``value`` as JSON that YAML reads back as the same value, every character included."""
    return _NOT_YAML_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))


# The words after ``--`` of submit, sweep and render: the script's arguments, after task.args.
PROGRAM_ARGS = ("task", "args")
PROGRAM_ARGS_GIVEN_AS = "the arguments after --"


def program_args_override(args: typing.Sequence[str]) -> Override:
    """``submit RECIPE -- ARGS...``: ARGS appended to task.args, each word as it is (one more input
    of the resolved recipe: the dry run shows what the job runs, the run record keeps it)."""
    if isinstance(args, str) or not all(isinstance(arg, str) for arg in args):
        raise UsageError(f"program arguments: give a list of texts, not {args!r}")
    for index, arg in enumerate(args, 1):
        if "\0" in arg:
            raise UsageError(
                f"{PROGRAM_ARGS_GIVEN_AS}: argument {index} holds a NUL character, which no program's argument can"
            )
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes the command line could not decode, kept as lone surrogates
            raise UsageError(f"{PROGRAM_ARGS_GIVEN_AS}: argument {index} is not UTF-8 text") from None
    return Override(PROGRAM_ARGS, list(args), PROGRAM_ARGS_GIVEN_AS, append=True)


def is_program_args(override: str | Override) -> bool:
    """Whether ``override`` (as a run record keeps it, or typed) is the arguments after ``--``."""
    if isinstance(override, Override):
        return override.append and override.key_path == PROGRAM_ARGS
    return override.startswith(".".join(PROGRAM_ARGS) + "+=")


def cluster_override(reference: str) -> Override:
    """``--cluster X``; a path is taken relative to here, not to the recipe."""
    given_as = f"{CLUSTER_PREFIX}{reference}"
    if "/" in reference or reference.endswith((".yaml", ".yml")):
        reference = str(expanded(reference).absolute())
    return Override(("cluster",), reference, given_as)


def load_recipe(
    path: str | Path,
    overrides: typing.Sequence[str | Override] = (),
    as_written: typing.Callable[[dict, SourceMap], None] | None = None,
) -> LoadedRecipe:
    """Load, merge, validate and resolve the recipe at ``path``; ``overrides`` are ``--set``
    texts (``key.path=value``) or typed :class:`Override` values, applied in order. ``as_written``
    checks the file's own keys (its bases merged) before any override: a caller that gives some keys
    itself refuses a file that writes them (raising RecipeError); the file is read once."""
    path = recipe_file(path)
    data, source = _load_with_bases(path, chain=())
    if not isinstance(data, dict):
        raise RecipeError(Finding(source.default, (), "a recipe must be a mapping of keys to values"))
    if as_written is not None:
        as_written(data, source)
    for override in overrides:
        _apply_override(data, source, override)
    fill_recipe_defaults(data, source)
    data.pop("extends", None)
    recipe = step_checks.with_training_task(convert(data, Recipe, source), source)
    profile, profile_path, profile_source = load_profile(recipe.cluster, path.parent, source.locate(("cluster",)))
    recipe, path_findings = resolve_local_paths(recipe, source)
    model_config = model_checks.read_model_config(recipe, source)
    recipe = checks.read_deepspeed_overrides(recipe, source)
    resolved, findings = checks.resolve_and_check(recipe, profile, source, profile_source, model_config)
    snapshot, snapshot_findings = resolve_snapshot(recipe, source)
    if resolved is not None and snapshot is not None:
        resolved = msgspec.structs.replace(resolved, snapshot=snapshot)
    findings = source.warnings + profile_source.warnings + path_findings + snapshot_findings + findings
    if resolved is not None:
        findings += hub_cache_findings(resolved, profile, source)
    findings = step_checks.relocated(findings, recipe, source)
    errors = [f for f in findings if f.severity == "error"]
    # No resolved recipe comes without an error saying why.
    if errors or resolved is None:
        raise RecipeErrors(errors) if len(errors) > 1 else RecipeError(errors[0])
    return LoadedRecipe(
        recipe=resolved,
        profile=profile,
        path=path,
        source=source,
        profile_path=profile_path,
        profile_source=profile_source,
        warnings=[f for f in findings if f.severity == "warning"],
        model_config=model_config,
        overrides=tuple(map(str, overrides)),
    )


def recipe_file(reference: str | Path) -> Path:
    """The recipe file a command was given: a path, or the name of a recipe shipped with clusterkit
    (``tiny-gpt2-cpu``: no folder, no suffix, no such file here), so that an installed clusterkit
    runs its examples from any directory, as ``cluster: NAME`` finds a shipped profile."""
    path = Path(reference)
    if path.exists() or "/" in str(reference) or path.suffix in (".yaml", ".yml"):
        return path
    shipped = BUILTIN_RECIPES_DIR / f"{reference}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in BUILTIN_RECIPES_DIR.glob("*.yaml"))
    raise RecipeError(
        Finding(
            Location(str(reference)),
            (),
            f"file not found, and no shipped recipe has this name (shipped: {', '.join(names)})",
        )
    )


def base_recipes(files: typing.Sequence[Path]) -> set[Path]:
    """The files among ``files`` that another one extends and that are no recipe on their own (no
    ``name`` or no ``task``): parts to build on, not jobs to validate alone."""
    extended: set[Path] = set()
    contents: dict[Path, Any] = {}
    for path in files:
        try:
            contents[path], _ = load_yaml_file(path)
        except RecipeError:
            continue  # reported when the file itself is loaded
        bases = contents[path].get("extends") if isinstance(contents[path], dict) else None
        for base in [bases] if isinstance(bases, str) else bases if isinstance(bases, list) else []:
            try:
                extended.add((path.parent / base).resolve())
            except (TypeError, ValueError, OSError, RuntimeError):  # no path (a NUL, a loop): said when it is loaded
                continue
    return {
        path
        for path, data in contents.items()
        if path.resolve() in extended and not (isinstance(data, dict) and "name" in data and "task" in data)
    }


def _load_with_bases(path: Path, chain: tuple[Path, ...]) -> tuple[Any, SourceMap]:
    data, source = load_yaml_file(path, pipe_ok=not chain)  # the recipe named may come through a pipe
    if not isinstance(data, dict) or "extends" not in data:
        return data, source
    bases = data["extends"]
    bases_location = source.locate(("extends",))
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise RecipeError(Finding(bases_location, ("extends",), "must be a path or a list of paths"))
    if len(chain) >= _MAX_EXTENDS_DEPTH:
        raise RecipeError(Finding(bases_location, ("extends",), f"more than {_MAX_EXTENDS_DEPTH} levels of extends"))
    merged: dict[str, Any] = {}
    merged_source = SourceMap(source.default)
    merged_source.warnings.extend(source.warnings)
    for base in bases:
        base_path = _base_file(path, base, bases_location)
        if base_path in chain or base_path == path.resolve():
            raise RecipeError(Finding(bases_location, ("extends",), f"circular extends through {base}"))
        base_data, base_source = _load_with_bases(base_path, chain + (path.resolve(),))
        if not isinstance(base_data, dict):
            raise RecipeError(Finding(base_source.default, (), "a base recipe must be a mapping"))
        base_data.pop("extends", None)
        merged_source.warnings.extend(base_source.warnings)
        _deep_merge(merged, base_data, merged_source, base_source, ())
    data = dict(data)
    _deep_merge(merged, data, merged_source, source, ())
    return merged, merged_source


def _base_file(path: Path, base: str, location: Location) -> Path:
    """The base recipe file ``base`` (in ``path``'s extends:) names, relative to ``path``'s folder."""
    problem = None
    if "\0" in base:
        problem = "a path cannot hold a NUL character"
    else:
        try:
            base_path = (path.parent / base).resolve()
            if not base_path.is_file():
                raise RecipeError(Finding(location, ("extends",), f"base recipe not found: {base}"))
            return base_path
        except RuntimeError:  # Python < 3.13 says a symlink loop so
            problem = "a loop of symbolic links"
        except OSError as exc:  # a name too long, a folder it may not enter
            problem = exc.strerror or str(exc)
    raise RecipeError(Finding(location, ("extends",), f"base recipe {base}: {problem}"))


def _deep_merge(into: dict, new: dict, into_source: SourceMap, new_source: SourceMap, path: KeyPath) -> None:
    """Merge ``new`` over ``into`` (mappings recursively, anything else replaced whole)."""
    for key, value in new.items():
        key_path = path + (key,)
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into_source.set(key_path, new_source.locate(key_path))
            _deep_merge(into[key], value, into_source, new_source, key_path)
            continue
        into[key] = copy.deepcopy(value)
        into_source.drop_below(key_path)
        into_source.set(key_path, new_source.locate(key_path))
        _copy_locations_below(new_source, into_source, key_path, value)


def _copy_locations_below(src: SourceMap, dst: SourceMap, path: KeyPath, value: Any) -> None:
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        dst.set(path + (key,), src.locate(path + (key,)))
        _copy_locations_below(src, dst, path + (key,), child)


def parse_key_path(key: str, display: str | None = None) -> KeyPath:
    """``"resources.nodes"`` → ("resources", "nodes"); a number is a list index (``ports.0``)."""
    parts = tuple(key.strip().split("."))
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*|\d+", p) for p in parts):
        raise RecipeError(
            Finding(
                Location(display or f"{OVERRIDE_PREFIX}{key}"), (), "expected key.path=value, e.g. resources.nodes=4"
            )
        )
    return tuple(int(p) if p.isdigit() else p for p in parts)


def parse_override(override: str) -> tuple[KeyPath, Any, SourceMap]:
    """``"resources.nodes=4"`` → (("resources", "nodes"), 4, its source map). The value is read as
    YAML, as the recipe file is (no base-60 numbers; an env value keeps its text)."""
    display = f"{OVERRIDE_PREFIX}{override}"
    key, sep, raw = override.partition("=")
    if not sep:
        raise RecipeError(Finding(Location(display), (), "expected key.path=value, e.g. resources.nodes=4"))
    key_path = parse_key_path(key, display)
    if not raw.strip():
        return key_path, "", SourceMap(Location(display))
    value, value_source = parse_yaml_text(raw, display, root=key_path, line=None)
    return key_path, value, value_source


def _apply_override(data: dict, source: SourceMap, override: str | Override) -> None:
    if isinstance(override, Override):
        key_path, value, append = override.key_path, override.value, override.append
    else:
        append = is_program_args(override)  # the one appending override a record keeps as text
        key_path, value, value_source = parse_override(override.replace("+=", "=", 1) if append else override)
        source.warnings.extend(value_source.warnings)
    given_as = override.given_as if isinstance(override, Override) else None
    location = Location(given_as or f"{OVERRIDE_PREFIX}{override}")
    if key_path[0] == "extends":  # the bases were merged as the file was read, before any override
        raise RecipeError(
            Finding(
                location,
                ("extends",),
                "cannot be set from the command line (the bases are merged "
                "as the file is read); write extends: in a recipe file",
            )
        )
    node: Any = data
    for depth, part in enumerate(key_path[:-1]):
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise RecipeError(Finding(location, key_path[: depth + 1], "cannot set a key inside a non-mapping value"))
        node = node.setdefault(part, {})
    last = key_path[-1]
    if append:
        _append(node, last, value, source, key_path, location)
        return
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise RecipeError(Finding(location, key_path, "cannot set a key inside a non-mapping value"))
    source.drop_below(key_path)
    source.set(key_path, location)


def _append(node: Any, last: Any, value: Any, source: SourceMap, key_path: KeyPath, location: Location) -> None:
    """The items of ``value`` after those of the list at ``key_path`` (none yet: a new list); each
    new item is located at ``location``, the list's own keep theirs."""
    current = node.get(last) if isinstance(node, dict) else None
    if current is None:
        current = []
    if not isinstance(node, dict) or not isinstance(current, list) or not isinstance(value, list):
        raise RecipeError(Finding(location, key_path, "adds items to a list; this is no list"))
    node[last] = [*current, *value]
    if not current:
        source.set(key_path, location)
    for index in range(len(current), len(current) + len(value)):
        source.set(key_path + (index,), location)


def load_profile(
    reference: str, base_dir: Path, where: Location | None = None
) -> tuple[ClusterProfile, Path, SourceMap]:
    """A cluster profile by name or path (``cluster:`` in a recipe, ``--cluster`` on the command
    line); ``where`` is what an unknown name is reported against."""
    user_dirs = load_user_config().profile_directories()
    profile_path = find_profile(reference, base_dir, user_dirs)
    if profile_path is None:
        known = available_profiles(base_dir, user_dirs)
        from difflib import get_close_matches

        close = get_close_matches(reference, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise RecipeError(
            Finding(
                where or Location("--cluster"),
                ("cluster",),
                f"no cluster profile '{reference}'; {hint}known profiles: {', '.join(known)}",
            )
        )
    data, profile_source = load_yaml_file(profile_path)
    if not isinstance(data, dict):
        raise RecipeError(Finding(profile_source.default, (), "a cluster profile must be a mapping"))
    return convert(data, ClusterProfile, profile_source), profile_path, profile_source

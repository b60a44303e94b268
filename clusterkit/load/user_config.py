"""The user's own defaults, one YAML file: ``$CLUSTERKIT_CONFIG``, else
``$XDG_CONFIG_HOME/clusterkit/config.yaml`` (``~/.config/clusterkit/config.yaml``).

Which value wins, highest first: command-line flags > environment > recipe > this file > cluster
profile > clusterkit's defaults. A missing file is normal (every value keeps its default); a file
that is there is checked as a recipe is: an unknown key or a wrong type is one
``file:line: key: message`` error (exit 2).

Reading it is cheap: nothing is imported or parsed when the file is missing, and a file is parsed
once per process (again only if it changed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from clusterkit.errors import Finding, Location, RecipeError
from clusterkit.load.yaml_source import KeyPath, SourceMap, load_yaml_file
from clusterkit.spec.notify import Notify
from clusterkit.spec.profile import ControlPersist
from clusterkit.spec.recipe import NonEmptyLine, _Struct

CONFIG_ENV = "CLUSTERKIT_CONFIG"
CONFIG_NAME = Path("clusterkit") / "config.yaml"
OWN_PROFILES = "clusters"


class SSHOptions(_Struct):
    """How this machine reaches login nodes. A value set here wins over a cluster profile's
    ``login:`` (it is this machine's choice, as the precedence says); unset (null) leaves it to the
    profile, then to clusterkit."""

    # auto: OpenSSH when an ``ssh`` client is on PATH, else paramiko.
    transport: Literal["auto", "openssh", "paramiko"] | None = None
    # How long an OpenSSH master connection outlives the last command (ssh's ControlPersist).
    control_persist: ControlPersist | None = None


class UserConfig(_Struct):
    # The cluster profile of a recipe that names none (``cluster:``; clusterkit's default: dev).
    cluster: NonEmptyLine | None = None
    # Directories of cluster profiles found by name, after $CLUSTERKIT_CLUSTERS and the recipe's
    # clusters/, before the shipped ones; relative to this file, ``~`` expanded.
    profile_dirs: list[NonEmptyLine] = msgspec.field(default_factory=list)
    # Where runs go (a recipe's runs_dir wins) and where status/logs/cancel/ls look (--runs-dir wins).
    runs_dir: NonEmptyLine | None = None
    ssh: SSHOptions = msgspec.field(default_factory=SSHOptions)
    # NAME=value lines for a recipe's secrets: that the environment does not set; relative to this
    # file, ``~`` expanded; readable by you only (schedulers.secret_values).
    secrets_file: NonEmptyLine | None = None
    # Where the events of every recipe without a notify: of its own go (spec.notify; the recipe's wins whole).
    notify: Notify | None = None


@dataclass(frozen=True)
class LoadedConfig:
    config: UserConfig
    path: Path
    from_env: bool  # named by $CLUSTERKIT_CONFIG
    source: SourceMap | None  # None: there is no file

    def location(self, key_path: KeyPath) -> Location:
        return self.source.locate(key_path) if self.source else Location(str(self.path))

    def is_set(self, key_path: KeyPath) -> bool:
        value: Any = self.config
        for key in key_path:
            value = getattr(value, str(key))
        return value not in (None, [])

    def ssh_settings(self) -> dict[str, Any]:
        """The ``ssh:`` values set here, by name: what replaces a profile's ``login:`` fields."""
        return {
            name: value
            for name in SSHOptions.__struct_fields__
            if (value := getattr(self.config.ssh, name)) is not None
        }

    def profile_directories(self) -> list[Path]:
        """The profile_dirs, then :meth:`own_profiles` (searched whether or not the file exists)."""
        return [*(self.path.parent / Path(text).expanduser() for text in self.config.profile_dirs), self.own_profiles]

    @property
    def own_profiles(self) -> Path:
        """``clusters/`` beside this file: where ``clusterkit profile init`` writes a profile, so that
        ``cluster: NAME`` finds it with no setting."""
        return self.path.parent / OWN_PROFILES

    def secrets_path(self) -> Path | None:
        """The secrets_file (relative to this file), or None."""
        secrets_file = self.config.secrets_file
        return None if secrets_file is None else self.path.parent / Path(secrets_file).expanduser()


def config_path() -> tuple[Path, bool]:
    """The config file, and whether $CLUSTERKIT_CONFIG named it."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser(), True
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    # XDG: a relative $XDG_CONFIG_HOME is invalid and is ignored.
    return (Path(base) if os.path.isabs(base) else Path.home() / ".config") / CONFIG_NAME, False


_cache: dict[tuple[Path, int, int], LoadedConfig] = {}


def load_user_config() -> LoadedConfig:
    path, from_env = config_path()
    try:
        stat = path.stat()
    except OSError:
        if from_env:  # named on purpose: a typo should not silently mean "no config"
            raise RecipeError(Finding(Location(str(path)), (), f"file not found (${CONFIG_ENV} names it)")) from None
        return LoadedConfig(UserConfig(), path, from_env, None)
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _cache:
        _cache.clear()
        _cache[key] = _parse(path, from_env)
    return _cache[key]


def _parse(path: Path, from_env: bool) -> LoadedConfig:
    data, source = load_yaml_file(path)
    if data is None:  # an empty file (or comments only)
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(Finding(source.default, (), "the user config must be a mapping of keys to values"))
    try:
        config = msgspec.convert(data, UserConfig, strict=True)
    except msgspec.ValidationError:
        # Worded as the recipe's errors are; imported only now (a valid config needs none of it).
        from clusterkit.load.convert import convert

        config = convert(data, UserConfig, source)
    return LoadedConfig(config, path, from_env, source)


def fill_recipe_defaults(data: dict[str, Any], source: SourceMap) -> None:
    """The recipe's ``cluster``, ``runs_dir`` and ``notify`` from the user config where the recipe
    (and its overrides) leave them out; its checks then point at the config file's line."""
    loaded = load_user_config()
    for key in ("cluster", "runs_dir", "notify"):
        value = getattr(loaded.config, key)
        if value is not None and key not in data:
            data[key] = msgspec.to_builtins(value)
            source.set((key,), loaded.location((key,)))
            for field in getattr(value, "__struct_fields__", ()):
                source.set((key, field), loaded.location((key, field)))

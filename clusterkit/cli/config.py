"""``clusterkit config``: the effective settings and where each came from, and the user config's
defaults for the commands that look runs up (``--runs-dir``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from clusterkit.cli.common import DEFAULT_RUNS_DIR, print_columns

if TYPE_CHECKING:
    from pathlib import Path

PRECEDENCE = """\
Which value wins, highest first:
  flags > environment > recipe > user config > cluster profile > clusterkit's defaults

The user config is $CLUSTERKIT_CONFIG, else $XDG_CONFIG_HOME/clusterkit/config.yaml
(~/.config/clusterkit/config.yaml); a missing file is normal. Its keys:
  cluster: NAME              the cluster profile of a recipe that names none (default: dev)
  profile_dirs: [DIR, ...]   more directories of cluster profiles, found by name after
                             $CLUSTERKIT_CLUSTERS and the recipe's clusters/, before the shipped ones
  runs_dir: DIR              where runs go (unless the recipe says) and where status, logs,
                             cancel and ls look (unless --runs-dir says)
  ssh: {transport: auto|openssh|paramiko, control_persist: 10m}
                             how this machine reaches login nodes (over a profile's login:)
  notify: {webhook_secret: NAME, email: ADDRESS, events: [failure, ...]}
                             where a recipe's job events go unless it has a notify: of its own"""


@dataclasses.dataclass(frozen=True)
class Setting:
    key: str
    value: str | None
    source: str  # flag, env, recipe, user config, profile or default
    where: str = ""  # the file (and line), flag or variable that set it


def fill_runs_dir(args: argparse.Namespace) -> None:
    """``--runs-dir`` when not given: the user config's runs_dir, else ./runs (read only by the
    commands that have the option, so --help and validate never parse the config)."""
    if getattr(args, "runs_dir", "") is None:
        from clusterkit.api import default_runs_dir

        args.runs_dir = default_runs_dir()


def settings(args: argparse.Namespace) -> list[Setting]:
    from pathlib import Path

    from clusterkit.load.user_config import CONFIG_ENV, load_user_config
    from clusterkit.spec.profile import BUILTIN_CLUSTERS_DIR, CLUSTERS_ENV, profile_search_path

    user = load_user_config()
    missing = "" if user.source else "not there: nothing set"
    found = [
        Setting(
            "config_file",
            str(user.path),
            *(("env", f"{CONFIG_ENV} {missing}".strip()) if user.from_env else ("default", missing)),
        )
    ]

    def from_user(key: str, default: str | None) -> Setting:
        if user.is_set((key,)):
            return Setting(key, str(getattr(user.config, key)), "user config", str(user.location((key,))))
        return Setting(key, default, "default")

    if args.recipe:
        found += _from_recipe(args, user.path)
    else:
        found.append(
            Setting("cluster", args.cluster, "flag", "--cluster") if args.cluster else from_user("cluster", "dev")
        )
        found.append(
            Setting("runs_dir", args.runs_dir, "flag", "--runs-dir")
            if args.runs_dir
            else from_user("runs_dir", DEFAULT_RUNS_DIR)
        )
    recipe_dir = Path(args.recipe).parent if args.recipe else Path.cwd()
    user_dirs = user.profile_directories()
    env_dirs = len(profile_search_path(recipe_dir)) - 2  # those before clusters/ and the shipped ones
    for index, directory in enumerate(profile_search_path(recipe_dir, user_dirs)):
        if index < env_dirs:
            origin = ("env", CLUSTERS_ENV)
        elif directory == BUILTIN_CLUSTERS_DIR:
            origin = ("default", "shipped with clusterkit")
        elif index == len(user_dirs) + env_dirs:  # the last of the user's: their own (clusterkit profile init's)
            origin = ("default", "clusters/ beside the user config (clusterkit profile init writes here)")
        elif index == env_dirs:
            origin = ("recipe", "clusters/ beside it") if args.recipe else ("default", "clusters/ here")
        else:
            origin = ("user config", str(user.location(("profile_dirs", index - env_dirs - 1))))
        found.append(Setting("profile_dirs", str(directory), *origin))
    for key in ("transport", "control_persist"):
        value = getattr(user.config.ssh, key)
        found.append(
            Setting(
                f"ssh.{key}",
                value if value is None or isinstance(value, str) else json.dumps(value),
                *(
                    ("user config", str(user.location(("ssh", key))))
                    if value is not None
                    else ("default", "the profile's login:, else clusterkit's")
                ),
            )
        )
    return found


def _from_recipe(args: argparse.Namespace, config_file: Path) -> list[Setting]:
    """``cluster`` and ``runs_dir`` as submitting ``args.recipe`` would take them."""
    from clusterkit.launch.prepare import cluster_override
    from clusterkit.load.loader import load_recipe
    from clusterkit.load.paths import COMMAND_LINE_PREFIXES

    loaded = load_recipe(args.recipe, [*(args.set or ()), *([cluster_override(args.cluster)] if args.cluster else [])])
    found = []
    for key, value in (("cluster", loaded.recipe.cluster), ("runs_dir", loaded.recipe.runs_dir)):
        where = loaded.source.locate((key,))
        if where is loaded.source.default:  # the recipe leaves it out
            in_profile = key == "runs_dir" and loaded.profile.runs_dir
            origin = ("profile", str(loaded.profile_source.locate((key,)))) if in_profile else ("default", "")
        elif where.file.startswith(COMMAND_LINE_PREFIXES):
            origin = ("flag", "--cluster" if key == "cluster" and args.cluster else where.file)
        elif where.file == str(config_file):
            origin = ("user config", str(where))
        else:
            origin = ("recipe", str(where))
        found.append(Setting(key, value, *origin))
    return found


def cmd_config(args: argparse.Namespace) -> int:
    found = settings(args)
    if args.json:
        print(json.dumps([dataclasses.asdict(setting) for setting in found], indent=2))
        return 0
    rows = [("SETTING", "VALUE", "FROM")]
    rows += [
        (s.key, "-" if s.value is None else s.value, s.source + (f" ({s.where})" if s.where else "")) for s in found
    ]
    print_columns(rows)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="the effective settings and where each came from (user config, recipe, ...)",
        description="The effective settings and where each came from.\n\n" + PRECEDENCE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "recipe", metavar="RECIPE", nargs="?", help="show cluster and runs_dir as submitting it would take them"
    )
    p.add_argument("--cluster", metavar="PROFILE", help="the cluster profile, instead of the recipe's")
    # "" rather than None: fill_runs_dir leaves it alone, so the user config's shows as such
    p.add_argument("--runs-dir", default="", help="where runs are looked up")
    p.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a recipe value, as submit takes it"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_config)

"""Shell completion (bash, zsh, fish) through argcomplete: ``clusterkit completion SHELL`` prints
the script to source; the shell then runs clusterkit with ``$_ARGCOMPLETE`` set, and
:func:`complete` answers from the built parser.

Completers are attached here, in one walk over the parser's actions by ``dest``, so the command
modules stay free of them. Nothing is imported for completion until the shell asks, and then only
what the word being completed needs (the recipe schema for ``--set``, the run index for a job).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from typing import Any

SHELLS = ("bash", "zsh", "fish")


def _recipe_files(prefix: str, **_: Any) -> Iterable[str]:
    from argcomplete.completers import FilesCompleter

    return FilesCompleter(("yaml", "yml"), directories=True)(prefix)


def _directories(prefix: str, **_: Any) -> Iterable[str]:
    from argcomplete.completers import DirectoriesCompleter

    return DirectoriesCompleter()(prefix)


def _profiles(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> Iterable[str]:
    """Profile names (shipped, $CLUSTERKIT_CLUSTERS, the recipe's clusters/, the user config's
    profile_dirs); a word with a ``/`` is a profile file."""
    if "/" in prefix:
        return _recipe_files(prefix)
    from pathlib import Path

    from clusterkit.load.user_config import load_user_config
    from clusterkit.spec.profile import available_profiles

    recipe = getattr(parsed_args, "recipe", None)
    return available_profiles(Path(recipe).parent if recipe else Path.cwd(), load_user_config().profile_directories())


def _job_ids(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> Iterable[str]:
    """Job ids of the run index, then of the runs under --runs-dir (or the user config's, or ./runs)."""
    from pathlib import Path  # here, not at the top: --help imports this module, and pathlib costs it ~2.5 ms

    from clusterkit.runs.index import indexed_job_ids
    from clusterkit.spec.layout import RUN_RECORD

    runs_dir = getattr(parsed_args, "runs_dir", None)
    if runs_dir is None:
        from clusterkit.cli.common import DEFAULT_RUNS_DIR
        from clusterkit.load.user_config import load_user_config

        runs_dir = load_user_config().config.runs_dir or DEFAULT_RUNS_DIR
    here = sorted(p.parent.name for p in Path(runs_dir).expanduser().glob(f"*/*/{RUN_RECORD}"))
    return list(dict.fromkeys([*indexed_job_ids(), *here]))


def recipe_key_paths() -> list[str]:
    """``key.path=`` for every value of the recipe schema (a mapping or list of free keys is set
    whole, or below by hand)."""
    import msgspec

    from clusterkit.spec.recipe import Recipe

    found: list[str] = []

    def walk(info: Any, path: str) -> None:
        structs = [t for t in getattr(info, "types", (info,)) if isinstance(t, msgspec.inspect.StructType)]
        if not structs:
            found.append(f"{path}=")
            return
        for struct in structs:
            for field in struct.fields:
                walk(field.type, f"{path}.{field.encode_name}" if path else field.encode_name)

    walk(msgspec.inspect.type_info(Recipe), "")
    return sorted(set(found))


def _key_paths(prefix: str, **_: Any) -> Iterable[str]:
    return [] if "=" in prefix else recipe_key_paths()


# dest -> completer: every option or argument with that dest, in every command.
COMPLETERS: dict[str, Callable[..., Iterable[str]]] = {
    "recipe": _recipe_files,
    "recipes": _recipe_files,
    "cluster": _profiles,
    "job": _job_ids,
    "job_b": _job_ids,  # diff's second run
    "after": _job_ids,
    "set": _key_paths,
    "grid": _key_paths,
    "runs_dir": _directories,
    "template_dir": _directories,
    "resume": _directories,
    "run_dir": _directories,
    "output": _directories,
    "checkpoint": _directories,
}


def attach_completers(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):
                attach_completers(command)
        elif action.dest in COMPLETERS:
            action.completer = COMPLETERS[action.dest]  # type: ignore[attr-defined]


def complete(parser: argparse.ArgumentParser) -> None:
    """When the shell asks (``$_ARGCOMPLETE`` set): print the completions and exit; else nothing."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    attach_completers(parser)
    argcomplete.autocomplete(parser)


def cmd_completion(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["clusterkit"], shell=args.shell), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "completion",
        help='the shell completion script: eval "$(clusterkit completion bash)"',
        description="Print the script that completes clusterkit's commands, options, recipe files, "
        'cluster profiles, job ids and --set keys. bash: eval "$(clusterkit completion '
        'bash)" in ~/.bashrc; zsh: the same in ~/.zshrc; fish: clusterkit completion fish '
        "| source in ~/.config/fish/config.fish",
    )
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=cmd_completion)

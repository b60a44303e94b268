"""Every command's --help ends with examples, and the examples cannot rot: each line parses with
the real parser, names recipes and cluster profiles that exist, and its recipe with its --set
values loads without an error. --help itself stays free of heavy imports."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import subprocess
import sys

import pytest

from clusterkit.cli.examples import EXAMPLES, HEADING, TOP_LEVEL
from clusterkit.cli.parser import build_parser
from clusterkit.load.loader import load_recipe
from clusterkit.spec.profile import find_profile
from conftest import REPO

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices
ALL_EXAMPLES = [(name, line) for name, lines in EXAMPLES.items() for line in lines] + [("", line) for line in TOP_LEVEL]


def test_every_command_has_two_to_four_examples_at_the_end_of_its_help() -> None:
    assert set(EXAMPLES) == set(COMMANDS), "a command without examples, or examples of no command"
    for name, command in COMMANDS.items():
        assert 2 <= len(EXAMPLES[name]) <= 4, name
        help_text = command.format_help()
        block = help_text[help_text.index(f"\n{HEADING}\n") + 1 :]
        assert block.splitlines()[1:] == [f"  {line}" for line in EXAMPLES[name]], name  # lines kept as written
        assert all(line.split("#")[0].split().count(name) for line in EXAMPLES[name]), name
    assert PARSER.format_help().rstrip().endswith("Each command's --help ends with examples of its own.")


def _words(line: str) -> list[str]:
    """The arguments after `clusterkit`, shell comments and redirections left out."""
    words = shlex.split(line, comments=True)
    words = words[: next((i for i, word in enumerate(words) if word in (">", "|", "&&")), len(words))]
    return words[words.index("clusterkit") + 1 :]


@pytest.mark.parametrize("command,line", ALL_EXAMPLES, ids=[line for _, line in ALL_EXAMPLES])
def test_an_example_parses_and_names_what_exists(command: str, line: str) -> None:
    words = _words(line)
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            args = PARSER.parse_args(words)
        except SystemExit:
            pytest.fail(f"{line}: {errors.getvalue()}")
    assert not command or args.command == command
    for word in words:
        if word.startswith("recipes/") or word.endswith((".yaml", ".yml")):
            assert (REPO / word).exists(), f"{line}: {word} is not in the repository"
    if getattr(args, "cluster", None):
        assert find_profile(args.cluster, REPO) is not None, f"{line}: no cluster profile {args.cluster}"
    for recipe in [getattr(args, "recipe", None), *getattr(args, "recipes", ())]:
        if recipe and (REPO / recipe).is_file():
            load_recipe(REPO / recipe, args.set or ())  # an error in the example's recipe or values raises


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from clusterkit.cli.main import main\n"
        f"for command in {[[], *([name] for name in COMMANDS)]!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        main([*command, '--help'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('rich', 'jinja2', 'torch', 'transformers', 'deepspeed', 'paramiko')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout == "[]\n", done.stdout

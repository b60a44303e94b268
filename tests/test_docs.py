"""The documentation cannot drift from the code: the site (mkdocs.yml, docs/) builds with every
warning an error, the examples marked runnable run, every `clusterkit` command line on its pages and
in the README parses with the real parser, and every test, file and link they name exists.

A fenced block runs when the line before its fence is `<!-- run -->` (exit 0 expected) or
`<!-- run: exit N -->`: ```bash through bash -e, ```python through this interpreter, in a fresh
folder holding `recipes/` (the shipped recipes), with this checkout's clusterkit first on PATH."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterkit.cli.parser import build_parser
from conftest import REPO

PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
MARKER = re.compile(r"<!-- run(?:: exit (\d+))? -->")
FENCE = re.compile(r"^(`{3,})(\w*)\s*$")
# Commands that need no cluster, no network and no job: a block of only these must be marked runnable.
OFFLINE_COMMANDS = {"validate", "render", "plan", "schema", "config"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    language: str
    code: str
    expected_exit: int | None  # None: not marked runnable

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == fence.group(1))
        before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.fullmatch(before)
        expected = (int(marker.group(1) or 0)) if marker else None
        found.append(Block(page, index + 1, fence.group(2), "\n".join(lines[index + 1 : end]) + "\n", expected))
        index = end + 1
    return found


BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.expected_exit is not None]


def _command_lines(block: Block) -> list[list[str]]:
    """The argument lists of the `clusterkit` commands in a shell block (prompts, continuation
    lines, comments, pipes, redirections and `&&` chains taken apart)."""
    text = block.code.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip().removeprefix("$ ")
        if "<<" in line or not line.startswith("clusterkit "):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for word in [*lexer, "&&"]:
            if word and set(word) <= set("|&;<>"):
                if words and words[0] == "clusterkit":
                    commands.append(words[1:])
                words = [] if word != ">" else ["(redirected)"]
            else:
                words.append(word)
    return commands


# -- the site ------------------------------------------------------------------------------------------------


def _mkdocs_build(config_dir: Path, site: Path) -> subprocess.CompletedProcess:
    if not _importable("mkdocs"):
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (bin/setup does)")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "NO_MKDOCS_2_WARNING": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = _mkdocs_build(REPO, tmp_path / "site")
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-4000:]
    for page in ("reference/recipe/index.html", "reference/profile/index.html", "reference/cli/index.html"):
        assert (tmp_path / "site" / page).is_file(), f"the hook did not generate {page}"
    recipe = (tmp_path / "site" / "reference" / "recipe" / "index.html").read_text()
    assert "gradient_accumulation_steps" in recipe and "Context parallelism" in recipe, "fields and their comments"
    profile = (tmp_path / "site" / "reference" / "profile" / "index.html").read_text()
    assert "proxy_jump" in profile and "interconnect" in profile
    assert "clusterkit schema" in (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()


@pytest.mark.parametrize(
    "damage",
    [
        ("guides/ssh.md", "\nSee [the missing page](no-such-page.md).\n", "no-such-page.md"),
        ("guides/ssh.md", "\nSee [a missing section](recipes.md#no-such-section).\n", "no-such-section"),
        ("guides/unlisted.md", "# A page the nav does not list\n", "guides/unlisted.md"),
    ],
    ids=["broken-link", "broken-anchor", "page-not-in-nav"],
)
def test_a_broken_link_or_an_unlisted_page_fails_the_build(tmp_path: Path, damage: tuple[str, str, str]) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy)
    shutil.copy(REPO / "ARCHITECTURE.md", copy)
    shutil.copytree(REPO / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    page, text, named = damage
    with (copy / "docs" / page).open("a") as file:
        file.write(text)
    done = _mkdocs_build(copy, tmp_path / "site")
    assert done.returncode != 0 and named in done.stderr, done.stderr[-2000:]


# -- the examples --------------------------------------------------------------------------------------------


@pytest.fixture
def example_folder(tmp_path: Path) -> dict[str, str]:
    """A fresh folder with the shipped recipes, and an environment whose `clusterkit` and `python`
    are this interpreter with this checkout."""
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    for name, argv in (
        ("clusterkit", f"{shlex.quote(sys.executable)} -m clusterkit.cli.main"),
        ("python", shlex.quote(sys.executable)),
    ):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "100",
    }


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_a_runnable_example_runs(block: Block, example_folder: dict[str, str], tmp_path: Path) -> None:
    if block.language == "bash":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    elif block.language == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        pytest.fail(f"{block.name}: only bash and python blocks can be marked runnable, not {block.language!r}")
    done = subprocess.run(argv, cwd=tmp_path, env=example_folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == block.expected_exit, f"{block.name}: exit {done.returncode}\n{done.stderr[-3000:]}"


def test_the_pages_have_runnable_examples() -> None:
    marked = {block.page.relative_to(REPO).as_posix() for block in RUNNABLE}
    assert {"README.md", "docs/getting-started.md", "docs/guides/profiles.md", "docs/guides/python.md"} <= marked
    assert any(block.expected_exit == 2 for block in RUNNABLE), "an example of a refused recipe"


SHELL_BLOCKS = [block for block in BLOCKS if block.language in ("bash", "console") and _command_lines(block)]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[block.name for block in SHELL_BLOCKS])
def test_every_command_line_parses_and_names_what_exists(block: Block) -> None:
    parser = build_parser()
    commands = _command_lines(block)
    for words in commands:
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            try:
                parser.parse_args(words)
            except SystemExit:
                pytest.fail(f"{block.name}: clusterkit {shlex.join(words)}: {errors.getvalue().strip()}")
        for word in words:
            if word.startswith("recipes/"):
                assert (REPO / word).exists(), f"{block.name}: {word} is not in the repository"
    if block.expected_exit is None and block.language == "bash":
        assert not all(words and words[0] in OFFLINE_COMMANDS for words in commands), (
            f"{block.name}: every command of this block runs without a cluster: mark it <!-- run -->"
        )


def test_the_command_line_reader_takes_a_block_apart() -> None:
    block = Block(
        REPO,
        1,
        "bash",
        "$ clusterkit plan r.yaml --top 3 > p.json && clusterkit schema | jq .\n"
        "clusterkit sweep r.yaml --grid a=1 \\\n    --grid b=2  # two\n",
        None,
    )
    assert _command_lines(block) == [
        ["plan", "r.yaml", "--top", "3"],
        ["schema"],
        ["sweep", "r.yaml", "--grid", "a=1", "--grid", "b=2"],
    ]


# -- what the pages name -------------------------------------------------------------------------------------


NAMED_TEST = re.compile(r"tests/(test_\w+\.py)::(\w+)")
CODE_PATH = re.compile(r"`((?:tests|bench|clusterkit|recipes|bin|docs)/[^`\s]*)`")


@functools.cache
def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_named_test_exists() -> None:
    named = [(page, file, test) for page in PAGES for file, test in NAMED_TEST.findall(page.read_text())]
    assert len(named) > 50, "the guarantees page names the tests behind each promise"
    missing = [
        f"{page.relative_to(REPO)}: tests/{file}::{test}"
        for page, file, test in named
        if not (REPO / "tests" / file).is_file() or test not in _defined_tests(REPO / "tests" / file)
    ]
    assert not missing, "named tests that do not exist:\n" + "\n".join(missing)


def test_every_repository_path_named_exists() -> None:
    missing = []
    for page in PAGES:
        for path in CODE_PATH.findall(page.read_text()):
            path = path.split("::")[0].rstrip(".,:;")
            if "<" in path or "{" in path:
                continue  # a pattern such as ranks/node<N>
            found = list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
            if not found:
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "paths the pages name that are not in the repository:\n" + "\n".join(missing)


def test_the_readmes_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert len(targets) > 20
    missing = [target for target in targets if not (REPO / target.split("#")[0]).exists()]
    assert not missing, missing


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    first = "bin/setup && bin/dev-cluster up && clusterkit submit recipes/tiny-gpt2-cpu.yaml --follow"
    assert readme.startswith(f"# clusterkit\n\n```bash\n{first}\nbin/setup && bin/test\n```\n")
    assert len(readme.splitlines()) <= 220, "the README links to the site rather than holding it"


def test_every_command_is_in_the_readmes_table() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    readme = (REPO / "README.md").read_text().splitlines()
    table = "\n".join(line for line in readme if line.startswith("| `clusterkit "))
    assert [name for name in commands if f"`clusterkit {name}" not in table] == []

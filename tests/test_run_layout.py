"""clusterkit.spec.layout is the one owner of the run directory's names: no other module of clusterkit
(or the in-job runner) spells one, and the built-in templates take them from the render context."""

from __future__ import annotations

import ast
import fnmatch
import inspect
import re
from pathlib import Path

import pytest

from clusterkit.spec import layout as run_layout

ROOT = Path(__file__).resolve().parent.parent
OWNER = ROOT / "clusterkit" / "run_layout.py"
SOURCES = sorted([*(ROOT / "clusterkit").glob("*.py"), *(ROOT / "clusterkit" / "runner").glob("*.py")])
TEMPLATES = sorted((ROOT / "clusterkit" / "render" / "templates").glob("*.j2"))
# What separates one name from the next in a message or a path: a name is never split by these.
_TOKEN_BREAK = re.compile(r"[\s/=()'\"`,;:]+")


def _layout_values() -> list[str]:
    """Every name the layout gives: constants as they are, functions called with ``*`` for each argument."""
    values = []
    for name, value in vars(run_layout).items():
        if name.startswith("_") or name in ("annotations", "Literal", "Stream", "STREAMS"):
            continue
        if isinstance(value, str):
            values.append(value)
        elif inspect.isfunction(value) and inspect.signature(value).return_annotation == "str":
            values.append(value(*["*"] * len(inspect.signature(value).parameters)))
    return values


def _components() -> set[str]:
    """The path components of every name, minus the pure wildcards (``*``, ``**``) that say nothing."""
    return {part for value in _layout_values() for part in value.split("/") if part.strip("*")}


COMPONENTS = _components()


def _plain(component: str) -> bool:
    """A plain word (``model``, ``ranks``, ``node*``) is a layout name only where a path is built:
    elsewhere it is a recipe key or a word in a message."""
    return re.fullmatch(r"[a-z_*]+", component) is not None


def _matches(token: str, component: str) -> bool:
    if component.startswith(".") and component.endswith(("-", "_")):  # a prefix: .staging-<random>
        return token.startswith(component)
    return fnmatch.fnmatchcase(token, component)


def _offending(text: str, in_path: bool) -> list[str]:
    """The layout names ``text`` spells; plain words count only in a path (a word with a ``/`` in
    it, or the whole text when it is an operand of ``/``), so ``GB/s`` or "per node" are no path."""
    found = set()
    for word in text.split():
        path_word = in_path or "/" in word
        for token in filter(None, _TOKEN_BREAK.split(word)):
            found |= {c for c in COMPONENTS if (path_word or not _plain(c)) and _matches(token, c)}
    return sorted(found)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of string statements (docstrings and string 'comments'): prose, not names in use."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _shape(node: ast.JoinedStr) -> str:
    """An f-string's text with ``*`` for each interpolated value: ``f"rank-{r}.json"`` → ``rank-*.json``."""
    return "".join(part.value if isinstance(part, ast.Constant) else "*" for part in node.values)


def layout_literals(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, text, layout names it spells) for every string in ``source`` that spells a layout name."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    path_operands = {
        id(operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        for operand in (node.left, node.right)
    }
    inside_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = _shape(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose | inside_fstrings:
            text = node.value
        else:
            continue
        names = _offending(text, id(node) in path_operands)
        if names:
            found.append((node.lineno, text, names))
    return found


def test_layout_names_are_plain_words():
    """The templates put names inside double quotes as they are: no quote, space, $ or line break."""
    for value in _layout_values():
        assert re.fullmatch(r"[A-Za-z0-9._*/-]+", value), value


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_spells_a_layout_name(path):
    if path == OWNER:
        return
    found = layout_literals(path.read_text(encoding="utf-8"))
    assert not found, "\n".join(
        f"{path.name}:{line}: {text!r} spells {names}: use clusterkit.spec.layout" for line, text, names in found
    )


def _rebound_layout_names(source: str) -> set[str]:
    """Names a module imports from run_layout and then assigns again at module level (as jobstate's
    state PREEMPTED once hid the preempted-record name): the layout name silently stops being used."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "clusterkit.spec.layout"
        for alias in node.names
    }
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in ast.walk(node)
        if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store)
    }
    return imported & assigned


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_hides_an_imported_layout_name(path):
    assert not _rebound_layout_names(path.read_text(encoding="utf-8"))


def test_the_rebinding_check_finds_a_hidden_name():
    source = 'from clusterkit.spec.layout import EXIT_CODE, METRICS\nA, METRICS = "a", "METRICS"\n'
    assert _rebound_layout_names(source) == {"METRICS"}


@pytest.mark.parametrize(
    "source, spelled",
    [
        ('open(run_dir / "metrics.jsonl")', [["metrics.jsonl"]]),
        ('p = run_dir / "ranks" / f"node{n}"', [["ranks"], ["node*"]]),
        ('x = f"{run}/{job}_{node}_log.err"', [["*_*_log.*"]]),
        ('x = f"rank-{rank}.json"', [["rank-*.json"]]),
        ('glob("ranks/node*.exit")', [["node*", "node*.exit", "ranks"]]),
        ('mkdtemp(prefix=".staging-")', [[".staging-"]]),
        ('help="the job.json the batch script wrote"', [["job.json"]]),
        ('help="default RUN_DIR/export"', [["export"]]),
        ('model = spec["model"]; print(f"{n} ranks per node, {b} GB/s; export PATH")', []),  # words, not paths
        ('def f():\n    """reads run_dir/job.json"""', []),  # prose
    ],
)
def test_the_check_finds_names_and_only_names(source, spelled):
    assert sorted(names for _, _, names in layout_literals(source)) == sorted(spelled)


def test_templates_take_names_from_the_layout():
    """No built-in template spells a name in a command (shell comments may mention them)."""
    for path in TEMPLATES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = re.sub(r"\{#.*?#\}|(^|\s)#(?!SBATCH).*$", "", line)
            names = _offending(re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", code), in_path=False)
            assert not names, (
                f"{path.name}:{number}: {line.strip()!r} spells {names}: use layout.<NAME> from the render context"
            )

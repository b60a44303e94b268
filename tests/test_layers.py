"""The package layout is the architecture (ARCHITECTURE.md): each layer imports only the layers
below it, nothing imports in a circle, only the in-job runtime imports torch at module level, and
no module grows past ~400 lines. Read from the source (every import statement, at module level or
inside a function), so a lazy import cannot slip past: a function's import is a layer's import, and
a circle through one is a circle (only an import for annotations, under TYPE_CHECKING, never runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "clusterkit"
MAX_LINES = 400

# Layer -> the layers it may import. Everything may import clusterkit.errors and clusterkit.version;
# the package root (whose lazy public names are the API's) only the API and the CLI; the CLI is on
# top and nothing imports it.
ALLOWED = {
    # The job's supervisor runs on the nodes with their Python: standard library only, nothing of ours.
    "supervisor": set(),
    "spec": {"recipes", "supervisor"},  # the shipped cluster profiles are data; the launch plan's classes
    "runs": {"spec", "supervisor"},
    "estimate": {"spec"},
    "load": {"spec", "estimate", "runs"},
    "render": {"spec", "load", "runs", "supervisor"},  # the supervisor is copied into every run
    "schedulers": {"spec", "load", "render", "runs", "supervisor"},  # the stacks signal the supervisor answers
    "launch": {"spec", "load", "render", "runs", "schedulers"},
    "plan": {"spec", "estimate", "load"},
    "diagnose": {"spec", "estimate", "load", "render", "runs", "schedulers", "launch", "plan"},
    "runtime": {"spec", "runs", "supervisor"},
    # The Python API: what the CLI does, as functions; the CLI is a thin layer over it.
    "api": {"", "spec", "estimate", "load", "render", "runs", "schedulers", "launch", "plan", "diagnose"},
    # Python functions as jobs (submitit): the API's Run, with a function's value.
    "functions": {"", "spec", "load", "runs", "launch", "api"},
    "cli": {
        "",
        "spec",
        "estimate",
        "load",
        "render",
        "runs",
        "schedulers",
        "launch",
        "plan",
        "diagnose",
        "api",
        "supervisor",
    },
}
EVERYWHERE = {"errors", "version"}
BOTTOM = ("", "errors", "version", "__main__")  # the root, the error taxonomy, the version: no layer of their own
# Where an import statement sits: run on import, run when its function is called, or never (for annotations).
MODULE_LEVEL, IN_FUNCTION, ANNOTATIONS = "module", "function", "annotations"
HEAVY = ("torch", "transformers", "deepspeed", "accelerate", "safetensors")
# Outside the runtime, heavy imports only inside a function, only here, and why:
HEAVY_INSIDE_FUNCTIONS = {
    "clusterkit.diagnose.host_facts",  # inspects this node's torch/CUDA/NCCL
    "clusterkit.estimate.modelsize",  # counts an unknown architecture's parameters on the meta device
    "clusterkit.runs.export",  # loads a checkpoint to save a from_pretrained model
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, str]]:
    """(imported module, where: MODULE_LEVEL, IN_FUNCTION or ANNOTATIONS) for every import in the
    file; ``from clusterkit.x import y`` counts as importing ``clusterkit.x.y`` when that is a module."""
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                inner = ANNOTATIONS  # never runs
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and where == MODULE_LEVEL:
                inner = IN_FUNCTION  # runs when called (an `if` or `try` at module level runs on import)
            if isinstance(child, ast.Import):
                found.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, inner))
                found.extend(
                    (f"{child.module}.{alias.name}", inner)
                    for alias in child.names
                    if f"{child.module}.{alias.name}" in MODULES
                )
            visit(child, inner)

    visit(ast.parse(path.read_text()), MODULE_LEVEL)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_lower_layers(module: str) -> None:
    layer = _layer(module)
    if layer in BOTTOM:
        return
    allowed = {layer} | ALLOWED[layer] | EVERYWHERE
    wrong = sorted(
        {
            name
            for name, _ in _imports(MODULES[module])
            if (name == "clusterkit" or name.startswith("clusterkit.")) and _layer(name) not in allowed
        }
    )
    assert not wrong, f"{module} ({layer}) imports {wrong}; {layer} may import {sorted(ALLOWED[layer])}"


def test_every_layer_has_its_rules() -> None:
    layers = {_layer(module) for module in MODULES} - set(BOTTOM)
    assert layers == set(ALLOWED), layers ^ set(ALLOWED)


def test_no_import_cycles() -> None:
    graph = {
        module: sorted(
            {name for name, where in _imports(path) if where != ANNOTATIONS and name in MODULES and name != module}
        )
        for module, path in MODULES.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_runtime_imports_torch(module: str) -> None:
    heavy = [
        (name, where)
        for name, where in _imports(MODULES[module])
        if name.split(".")[0] in HEAVY and where != ANNOTATIONS
    ]
    if _layer(module) == "runtime" or not heavy:
        return
    assert module in HEAVY_INSIDE_FUNCTIONS, f"{module} imports {sorted({n for n, _ in heavy})}"
    assert not [name for name, where in heavy if where == MODULE_LEVEL], f"{module} imports torch & co. at module level"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_long(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines (split it by what its parts are about)"


def test_the_walk_sees_what_it_should() -> None:
    """The checks above would pass vacuously if the walk found nothing."""
    assert {"clusterkit.cli.main", "clusterkit.schedulers.api", "clusterkit.runtime.train"} <= set(MODULES)
    imports = dict(_imports(MODULES["clusterkit.runtime.train"]))
    assert imports.get("torch") == MODULE_LEVEL and "clusterkit.spec.resolved" in imports
    lazy = dict(_imports(MODULES["clusterkit.cli.recipes"]))
    assert lazy.get("clusterkit.load.loader") == IN_FUNCTION  # inside cmd_validate
    assert dict(_imports(MODULES["clusterkit"])).get("clusterkit.api") == ANNOTATIONS

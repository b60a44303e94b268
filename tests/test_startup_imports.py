"""What the quick commands import. A login node starts them often and every module they import
costs each start (bench/startup.py times them), so each command is run in a fresh interpreter and
what it added to a bare one's modules is checked against what it must not need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
# argcomplete: only when the shell asks for completions ($_ARGCOMPLETE set), ~8 ms otherwise.
NEVER = {"torch", "transformers", "deepspeed", "accelerate", "paramiko", "submitit", "argcomplete"}
# The modules a parser needs none of: the recipe stack, the renderer, rich, and what only a running
# command imports.
NOT_FOR_HELP = {"jinja2", "yaml", "msgspec", "rich", "clusterkit.errors", "clusterkit.load.loader", "pathlib"}

COMMANDS = {
    "--help": (["--help"], NOT_FOR_HELP),
    "a usage error": (["validate"], NOT_FOR_HELP),
    "validate": (["validate", "-q", str(RECIPES)], {"jinja2", "rich", "clusterkit.render.job", "tempfile"}),
    "render": (["render", str(RECIPES / "llama-7b-zero3-ib.yaml"), "-o", "{tmp}/out"], {"rich"}),
    "plan --json": (["plan", str(RECIPES / "llama-7b-zero3-ib.yaml"), "--json"], {"rich", "jinja2"}),
    # status goes through clusterkit.api, which imports the loader (PyYAML, msgspec) to be importable whole.
    "status --json": (["status", "--json", "--runs-dir", "{tmp}"], {"rich", "jinja2"}),
    "schema": (["schema"], {"rich", "jinja2", "yaml"}),
    "validate --json": (["validate", "--json", str(RECIPES / "tiny-gpt2-cpu.yaml")], {"rich", "jinja2"}),
    "ls --json": (["ls", "--json", "--runs-dir", "{tmp}"], {"rich", "jinja2"}),
    "submit --dry-run --json": (
        ["submit", "--dry-run", "--json", "--executor", "local", str(RECIPES / "tiny-gpt2-cpu.yaml")],
        {"rich"},
    ),
}


def _imported(code: str, tmp_path: Path) -> set[str]:
    """The modules in sys.modules after ``code`` ran in a fresh interpreter (written to a file: the
    command itself prints to stdout and stderr)."""
    listing = tmp_path / "modules.txt"
    script = f"{code}\nimport sys\nopen({str(listing)!r}, 'w').write('\\n'.join(sys.modules))"
    subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        cwd=tmp_path,
        check=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # a cache folder of its own
    return set(listing.read_text().split())


def _main(argv: list[str]) -> str:
    return (
        "from clusterkit.cli.main import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as exit:\n    code = exit.code\n"
        "assert code in (0, 2), code"
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_quick_command_imports_only_what_it_needs(command: str, tmp_path: Path) -> None:
    argv, not_needed = COMMANDS[command]
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    bare = _imported("", tmp_path)  # what this interpreter's site (a .pth, an editable install) already loads
    added = _imported(_main(argv), tmp_path) - bare
    assert "clusterkit.cli.main" in added  # the command ran here
    assert not (NEVER | not_needed) & added, sorted((NEVER | not_needed) & added)

"""Ops templates (--template-dir, $CLUSTERKIT_TEMPLATES, the recipe's folder) are input too: a template
that cannot be read or rendered is one line `template-file:line: template: message` and exit 2, never
a traceback; a template that renders no job script, or a template directory that is not there, is
refused before anything is written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
BUILTIN = REPO / "clusterkit" / "render" / "templates"


def _render(ops: Path, how: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``clusterkit render`` with the ops folder given as --template-dir or in $CLUSTERKIT_TEMPLATES."""
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERKIT_TEMPLATES"}
    if how == "flag":
        return run_cli("render", str(TINY), "--template-dir", str(ops), "-o", str(out), env=env)
    return run_cli("render", str(TINY), "-o", str(out), env={**env, "CLUSTERKIT_TEMPLATES": str(ops)})


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.rstrip("\n")


# (template file, its text, the line the error is on, a fragment of the message)
BROKEN = {
    "if-without-test": ("env.sh.j2", "# ops\n{% if %}\n", 2, "template: Expected an expression"),
    "undefined-name": ("env.sh.j2", "# ops\n\nexport X={{ nosuch }}\n", 3, "template: 'nosuch' is undefined"),
    "undefined-attribute": ("env.sh.j2", "export X={{ recipe.resourcez.nodes }}\n", 1, "template: "),
    "division-by-zero": ("env.sh.j2", "# ops\n{{ 1/0 }}\n", 2, "template: ZeroDivisionError: division by zero"),
    "unclosed-block": ("job.sbatch.j2", "#!/bin/bash\n{% for x in [1] %}\n", 2, "template: Unexpected end of template"),
    "include-of-nothing": (
        "env.sh.j2",
        "# ops\n\n{% include 'nosuch.j2' %}\n",
        3,
        "template: nosuch.j2 is in none of the template directories",
    ),
    "includes-itself": ("env.sh.j2", "# ops\n{% include 'env.sh.j2' %}\n", 2, "template: includes itself"),
}


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_ops_template_is_one_line_with_its_file_and_line(case: str, how: str, tmp_path: Path) -> None:
    name, text, line, fragment = BROKEN[case]
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / name).write_text(text)
    out = tmp_path / "out"
    message = _one_line(_render(ops, how, out))
    assert message.startswith(f"{ops / name}:{line}: template: "), message
    assert fragment in message, message
    assert not out.exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_template_that_is_no_text_is_named(how: str, tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "env.sh.j2").write_bytes(b"\xff\xfe\x00\x1b[31mbinary")
    message = _one_line(_render(ops, how, tmp_path / "out"))
    assert message.startswith(f"{ops / 'env.sh.j2'}: template: not UTF-8 text"), message
    assert not (tmp_path / "out").exists()


def test_a_broken_template_in_the_recipes_folder_and_one_it_includes(tmp_path: Path) -> None:
    """The recipe's own folder is on the search path too; an error in an included template is said
    where it is, not where the include is."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text())
    (tmp_path / "env.sh.j2").write_text("# site\n{% include 'site-extra.j2' %}\n")
    (tmp_path / "site-extra.j2").write_text("ok\n{{ layout.NO_SUCH_NAME }}\n")
    message = _one_line(run_cli("render", str(recipe), "-o", str(tmp_path / "out")))
    assert message.startswith(f"{tmp_path / 'site-extra.j2'}:2: template: "), message
    assert "NO_SUCH_NAME" in message


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("text", ["", "\n  \n\t\n", "{% if false %}#!/bin/bash{% endif %}\n"])
def test_a_job_template_that_renders_no_script_is_refused(text: str, how: str, tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "job.sbatch.j2").write_text(text)
    message = _one_line(_render(ops, how, tmp_path / "out"))
    assert message == f"{ops / 'job.sbatch.j2'}: template: renders an empty job script", message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_job_script_sbatch_would_not_take_is_refused(how: str, tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "job.sbatch.j2").write_text("echo no interpreter line\n")
    message = _one_line(_render(ops, how, tmp_path / "out"))
    assert message == (
        f"{ops / 'job.sbatch.j2'}: template: the job script must start with #! "
        f"(sbatch takes no other), not 'echo no interpreter line'"
    ), message


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("kind", ["missing", "a file", "~ % -x\nname"])
def test_a_template_directory_that_is_not_one_is_refused(kind: str, how: str, tmp_path: Path) -> None:
    ops = tmp_path / ("ops" if kind != "~ % -x\nname" else kind)
    if kind == "a file":
        ops.write_text("{}")
    message = _one_line(_render(ops, how, tmp_path / "out"))
    shown = str(ops).replace("\n", "\\n")
    assert message == f"{shown}: template directory: {'not a directory' if kind == 'a file' else 'no such directory'}"
    assert not (tmp_path / "out").exists()


def test_a_good_ops_template_still_renders(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "env.sh.j2").write_text("# site policy\n" + (BUILTIN / "env.sh.j2").read_text())
    done = _render(ops, "flag", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "env.sh").read_text().startswith("# site policy\n")

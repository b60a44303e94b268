"""Recipe input that crashed the loader or was silently dropped: `extends:` with a NUL or through a
symlink loop, `--set extends=`, an unknown `--cluster`, a folder with no recipe. Each is one line and
exit 2 (or, for the folder, says what it found)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.rstrip("\n")


@pytest.mark.parametrize("command", ["validate", "render"])
def test_extends_with_a_nul_is_one_line(command: str, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text('extends: "base\\0.yaml"\n' + TINY.read_text())
    message = _one_line(run_cli(command, str(recipe), *(["-o", str(tmp_path / "out")] if command == "render" else [])))
    assert message == f"{recipe}:1: extends: base recipe base\\x00.yaml: a path cannot hold a NUL character"


@pytest.mark.parametrize("target", ["loop-a", "sub/../loop-a", "self"])
def test_extends_through_a_symlink_loop_is_one_line(target: str, tmp_path: Path) -> None:
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    os.symlink("self", tmp_path / "self")
    (tmp_path / "sub").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: [{target}]\n" + TINY.read_text())
    message = _one_line(run_cli("validate", str(recipe)))
    assert message == f"{recipe}:1: extends: base recipe {target}: a loop of symbolic links"


def test_extends_with_a_name_too_long_is_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {'x' * 300}.yaml\n" + TINY.read_text())
    message = _one_line(run_cli("validate", str(recipe)))
    assert message == f"{recipe}:1: extends: base recipe {'x' * 300}.yaml: File name too long"


def test_a_folder_holding_a_recipe_with_a_hostile_extends_is_validated(tmp_path: Path) -> None:
    """validate DIR reads every file's extends first (to skip base files): a NUL or a loop there is
    reported against its file, with the others still validated."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    os.symlink("loop", folder / "loop")
    (folder / "a.yaml").write_text('extends: "x\\0y"\n' + TINY.read_text())
    (folder / "b.yaml").write_text("extends: loop\n" + TINY.read_text())
    (folder / "c.yaml").write_text(TINY.read_text())
    done = run_cli("validate", str(folder))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 2 and f"{folder / 'a.yaml'}:1: extends: " in done.stderr
    assert f"{folder / 'c.yaml'}: ok" in done.stdout and "1 of 3 recipes valid" in done.stdout


@pytest.mark.parametrize("value", ["x.yaml", "[]", "''"])
def test_set_extends_is_refused_not_ignored(value: str, tmp_path: Path) -> None:
    base = tmp_path / "x.yaml"
    base.write_text("resources: {nodes: 1}\n")
    done = run_cli("validate", str(TINY), "--set", f"extends={value}", cwd=tmp_path)
    message = _one_line(done)
    assert message.startswith(f"--set extends={value}: extends: cannot be set from the command line"), message


def test_set_inside_extends_is_refused_too() -> None:
    message = _one_line(run_cli("validate", str(TINY), "--set", "extends.0=x.yaml"))
    assert "extends: cannot be set from the command line" in message


@pytest.mark.parametrize("command", ["submit", "config", "sweep"])
@pytest.mark.parametrize("cluster", ["nosuch", "no/such.yaml", "-x %~"])
def test_an_unknown_cluster_names_the_cluster_flag(command: str, cluster: str, tmp_path: Path) -> None:
    extra = {"submit": ["--dry-run"], "config": [], "sweep": ["--grid", "resources.nodes=1,2", "--dry-run"]}[command]
    done = run_cli(command, str(TINY), f"--cluster={cluster}", *extra, cwd=tmp_path)
    message = _one_line(done)
    assert message.startswith(f"--cluster {cluster}: cluster: no cluster profile"), message
    assert "--set" not in message


def test_a_cluster_name_of_two_lines_is_refused_as_the_cluster_flag() -> None:
    message = _one_line(run_cli("submit", str(TINY), "--cluster", "a\nb", "--dry-run"))
    assert message.startswith("--cluster a\\nb: cluster: must be a non-empty single line"), message


def test_a_cluster_set_with_set_is_still_named_as_set() -> None:
    message = _one_line(run_cli("validate", str(TINY), "--set", "cluster=nosuch"))
    assert message.startswith("--set cluster=nosuch: cluster: no cluster profile"), message


@pytest.mark.parametrize("content", ["nothing", "other files"])
def test_validate_a_folder_without_recipes_says_so(content: str, tmp_path: Path) -> None:
    folder = tmp_path / "empty -x ~%"
    folder.mkdir()
    if content == "other files":
        (folder / "notes.txt").write_text("hi")
        (folder / "clusters").mkdir()
        (folder / "clusters" / "site.yaml").write_text("name: site\n")
    done = run_cli("validate", str(folder))
    message = _one_line(done)
    assert message == f"clusterkit: {folder}: no recipe (*.yaml, *.yml) in this folder", message
    assert done.stdout == ""
    as_json = run_cli("validate", "--json", str(folder))
    assert as_json.returncode == 2 and as_json.stderr.rstrip("\n") == message


def test_validate_a_folder_with_recipes_and_an_empty_one(tmp_path: Path) -> None:
    full, empty = tmp_path / "full", tmp_path / "empty"
    full.mkdir()
    empty.mkdir()
    (full / "r.yaml").write_text(TINY.read_text())
    message = _one_line(run_cli("validate", str(full), str(empty)))
    assert message == f"clusterkit: {empty}: no recipe (*.yaml, *.yml) in this folder"
    done = run_cli("validate", "--json", str(full))
    assert done.returncode == 0 and json.loads(done.stdout)["valid"] == 1

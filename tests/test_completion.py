"""Shell completion, driven through a real bash: the script `clusterkit completion bash` prints is
sourced, COMP_WORDS/COMP_CWORD/COMP_LINE/COMP_POINT are set as bash sets them, the completion
function runs (starting clusterkit as the shell would) and COMPREPLY is read back. zsh and fish
(installed by bin/setup) are driven too; without them their scripts are only checked."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterkit.cli.completion import recipe_key_paths
from clusterkit.runs import index
from clusterkit.runs.record import RunRecord
from conftest import RECIPES, REPO, run_cli

DRIVER = r"""
eval "$(clusterkit completion bash)"
line=$1
COMP_LINE=$line
COMP_POINT=${#line}
read -ra COMP_WORDS <<< "$line"
[[ $line == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMPREPLY=()
_python_argcomplete clusterkit
printf '%s\n' "${COMPREPLY[@]}"
"""

# zsh outside an interactive session: the script's own completion function runs as zsh's completion
# system would call it (BUFFER, CURSOR, words set); only _describe, which would show the matches in
# the line editor, prints them instead, and compdef (compinit's) registers nothing.
ZSH_DRIVER = r"""
compdef() { : }
source $1
_describe() { print -rl -- "${(@P)2}" }
BUFFER=$2
CURSOR=${#BUFFER}
words=(${=BUFFER})
[[ $BUFFER == *" " ]] && words+=("")
_python_argcomplete
"""


@pytest.fixture
def shell_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """PATH with a ``clusterkit`` that runs this checkout, and config and state dirs of our own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "clusterkit"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m clusterkit "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }


def complete(line: str, env: dict[str, str], cwd: Path) -> list[str]:
    done = subprocess.run(
        ["bash", "--norc", "-c", DRIVER, "driver", line], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [word.rstrip() for word in done.stdout.splitlines() if word]


def test_commands_and_options(tmp_path: Path, shell_env: dict[str, str]) -> None:
    assert complete("clusterkit stat", shell_env, tmp_path) == ["status"]
    assert set(complete("clusterkit c", shell_env, tmp_path)) == {"cancel", "config", "completion"}
    assert complete("clusterkit submit --dr", shell_env, tmp_path) == ["--dry-run"]
    assert complete("clusterkit submit --executor l", shell_env, tmp_path) == ["local"]
    assert complete("clusterkit completion f", shell_env, tmp_path) == ["fish"]


def test_recipe_files_and_directories(tmp_path: Path, shell_env: dict[str, str]) -> None:
    for name in ("a.yaml", "b.yml", "notes.txt", "with space.yaml"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub dir").mkdir()
    found = complete("clusterkit validate ", shell_env, tmp_path)
    assert {"a.yaml", "b.yml", r"with\ space.yaml", r"sub\ dir/"} <= set(found) and "notes.txt" not in found
    assert complete("clusterkit submit wi", shell_env, tmp_path) == [r"with\ space.yaml"]


def test_cluster_profiles_shipped_and_from_the_search_path(tmp_path: Path, shell_env: dict[str, str]) -> None:
    mine = tmp_path / "my profiles"
    mine.mkdir()
    shutil.copy(RECIPES / "clusters" / "dev.yaml", mine / "zz-mine.yaml")
    (tmp_path / "config" / "clusterkit").mkdir(parents=True)
    (tmp_path / "config" / "clusterkit" / "config.yaml").write_text(yaml.safe_dump({"profile_dirs": [str(mine)]}))
    env_dir = tmp_path / "env-profiles"
    env_dir.mkdir()
    shutil.copy(RECIPES / "clusters" / "dev.yaml", env_dir / "zz-env.yaml")
    env = {**shell_env, "CLUSTERKIT_CLUSTERS": str(env_dir)}
    found = complete("clusterkit submit r.yaml --cluster ", env, tmp_path)
    assert {"dev", "zz-mine", "zz-env"} <= set(found) and "aws-efa" in found
    assert complete("clusterkit ls --cluster zz-m", env, tmp_path) == ["zz-mine"]


def test_job_ids_of_known_runs(tmp_path: Path, shell_env: dict[str, str]) -> None:
    for job_id in ("4242", "4243_7"):
        run_dir = tmp_path / "runs" / "x" / job_id
        run_dir.mkdir(parents=True)
        record = RunRecord(job_id, "x", "local", str(run_dir), "r.yaml", time.time(), 1, 1, "torchrun")
        record.write()
        index.add_run(record, run_dir)
    gone = RunRecord("4244", "x", "local", str(tmp_path / "deleted"), "r.yaml", time.time(), 1, 1, "torchrun")
    index.add_run(gone, tmp_path / "deleted")
    away = tmp_path / "elsewhere"
    away.mkdir()
    assert set(complete("clusterkit status 42", shell_env, away)) == {"4242", "4243_7"}  # from the index
    assert complete("clusterkit logs 4243", shell_env, away) == ["4243_7"]
    assert complete("clusterkit submit r.yaml --after 4242", shell_env, away) == ["4242"]
    index.index_path().write_bytes(b"\x00garbage\n")  # a damaged index: nothing to offer, no noise
    assert complete("clusterkit cancel 42", shell_env, away) == []
    assert complete("clusterkit cancel 42", shell_env, tmp_path) == ["4242", "4243_7"]  # ./runs here


def test_set_and_grid_key_paths_from_the_recipe_schema(tmp_path: Path, shell_env: dict[str, str]) -> None:
    assert complete("clusterkit submit r.yaml --set resources.no", shell_env, tmp_path) == ["resources.nodes="]
    assert complete("clusterkit sweep r.yaml --grid parallelism.micro", shell_env, tmp_path) == [
        "parallelism.micro_batch_size="
    ]
    assert complete("clusterkit render r.yaml --set resources.nodes=", shell_env, tmp_path) == []  # a value
    paths = recipe_key_paths()
    assert {"cluster=", "resources.nodes=", "task.trainer.args=", "env="} <= set(paths) and "resources=" not in paths


def test_no_completion_without_the_shell_asking(tmp_path: Path) -> None:
    """``_ARGCOMPLETE`` unset: a normal run, argcomplete not even imported."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from clusterkit.cli.main import main; main(['ls']); print('argcomplete' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.splitlines()[-1] == "False", done.stderr


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_zsh_and_fish_scripts(tmp_path: Path, shell_env: dict[str, str], shell: str) -> None:
    done = run_cli("completion", shell)
    assert done.returncode == 0 and done.stderr == ""
    script = done.stdout
    assert ("#compdef clusterkit" in script) if shell == "zsh" else ("complete --command clusterkit" in script)
    assert "_ARGCOMPLETE" in script
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: its script is checked, not driven")
    (tmp_path / "c.sh").write_text(script)
    check = subprocess.run([shell, "-n", str(tmp_path / "c.sh")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    for line, expected in (("clusterkit stat", "status"), ("clusterkit validate --q", "--quiet")):
        if shell == "fish":
            driven = subprocess.run(
                ["fish", "--no-config", "-c", f"source {tmp_path / 'c.sh'}; complete -C {shlex.quote(line)}"],
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        else:
            driven = subprocess.run(
                ["zsh", "-f", "-c", ZSH_DRIVER, "driver", str(tmp_path / "c.sh"), line],
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        # fish: "status<TAB>description"; zsh: "status:description"
        assert [word.split(":")[0] for word in driven.stdout.split()[:1]] == [expected], driven.stderr


def test_the_bash_script_is_what_argcomplete_makes(tmp_path: Path) -> None:
    import argcomplete

    assert run_cli("completion", "bash").stdout == argcomplete.shellcode(["clusterkit"], shell="bash")
    assert run_cli("completion", "tcsh").returncode == 2

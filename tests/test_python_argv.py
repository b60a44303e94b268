"""`python:` is one word or an argv list. `python: "python3 -u"` used to validate and render as one
quoted word, so every node failed with 127; now a string with spaces is refused and a list runs as
its words (on the local executor here, the same batch script SLURM runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from conftest import REPO, run_cli

SCRIPT = REPO / "tests" / "scripts" / "echo_contract.py"


def _recipe(tmp_path: Path, python: object) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "argv",
                "resources": {"nodes": 1, "gpus_per_node": 1, "time": "5"},
                "task": {"script": str(SCRIPT)},
                "python": python,
                "runs_dir": str(tmp_path / "runs"),
            }
        )
    )
    return path


def test_a_command_with_spaces_is_refused_with_the_list_form_named(tmp_path: Path) -> None:
    done = run_cli("validate", str(_recipe(tmp_path, "python3 -u")))
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "python: must be one word without spaces (give a list for a command with arguments, e.g. [python3, -u])"
    ), done.stderr


def test_an_argv_list_runs_as_its_words(tmp_path: Path) -> None:
    # `env MARK=... python3`: the ranks can only see MARK if every word of the list was run as a word.
    recipe = _recipe(tmp_path, ["env", "CLUSTERKIT_TEST_MARK=a b", "python3", "-u"])
    done = run_cli("submit", str(recipe), "--executor", "local", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_dir = Path(next(line for line in done.stdout.splitlines() if line.startswith("run dir: ")).split(": ", 1)[1])
    deadline = time.time() + 120
    while not (run_dir / "exit_code").exists() and time.time() < deadline:
        time.sleep(0.3)
    assert (run_dir / "exit_code").read_text().strip() == "0", (run_dir / f"{run_dir.name}_0_log.err").read_text()
    seen = json.loads((run_dir / "contract" / "rank-0.json").read_text())
    assert seen["env"]["CLUSTERKIT_TEST_MARK"] == "a b"

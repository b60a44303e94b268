"""A value of the wrong format in a formatted field (a SLURM time, a memory size, a name) is told
the format it must have, in one `file:line: key: message` line, exit 2: never a hint meant for
another field, nor a regex, nor msgspec's `Expected str | null`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgspec
import pytest

from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import PATTERN_HINTS, Recipe
from conftest import run_cli

# The line under test is line 5, in resources.
RECIPE = """\
name: t
resources:
  nodes: 1
  gpus_per_node: 2
{line}
task:
  script: train.py
"""
TIME = "must be a SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 1:30:00, 2-00:00:00)"
MEMORY = (
    "must be a SLURM memory size: a whole number of megabytes, or one with a K, M, G or T suffix "
    "(e.g. 4000M, 4G, 480G); 0 for all of a node's memory"
)


def _errors(tmp_path: Path, text: str) -> tuple[Path, list[str], int]:
    """The error lines (warnings left out) and the exit status of validating ``text``."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(text))
    done = run_cli("validate", str(recipe))
    assert "Traceback" not in done.stderr
    return recipe, [line for line in done.stderr.splitlines() if ": warning: " not in line], done.returncode


@pytest.mark.parametrize(
    "line,message",
    [
        ('  time: "1h"', TIME),
        ("  time: 1h", TIME),
        ("  time: 1.5", f"{TIME}, not a decimal number (quote it to make it text)"),
        ("  time: true", f"{TIME}, not true/false (quote it to make it text)"),
        ("  time: 0", f"{TIME}; expected `int` >= 1"),
        ("  time: [1]", f"{TIME}, not a list"),
        ("  time_min: 2 hours", TIME),
        ("  mem: 4GB", MEMORY),
        ("  mem: 4.5G", MEMORY),
        ("  mem: 4.5", f"{MEMORY}, not a decimal number (quote it to make it text)"),
        ("  mem: {G: 4}", f"{MEMORY}, not a mapping"),
        ("  array: 0-9x", "must be a SLURM array spec such as 0-9, 1,3,5-7 or 0-15:2%4"),
        (
            '  partition: "gpu\\n#SBATCH --x"',
            "must be a non-empty single line of text without control characters or line breaks",
        ),
    ],
    ids=lambda value: value.strip() if value.startswith("  ") else "",
)
def test_a_resources_value_of_the_wrong_format_says_the_format(tmp_path: Path, line: str, message: str) -> None:
    key = line.strip().split(":")[0]
    recipe, errors, code = _errors(tmp_path, RECIPE.format(line=line))
    assert code == 2
    assert errors == [f"{recipe}:5: resources.{key}: {message}"]


@pytest.mark.parametrize("memory,sbatch", [("0", "0"), ("4096", "4096"), ('"4G"', "4G")])
def test_memory_as_a_number_is_megabytes_as_sbatch_reads_it(tmp_path: Path, memory: str, sbatch: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(line=f"  mem: {memory}\n  time: '10'"))
    out = tmp_path / "out"
    done = run_cli("render", str(recipe), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"#SBATCH --mem={sbatch}\n" in (out / "job.sbatch").read_text()


def test_a_class_name_is_not_told_it_is_an_environment_variable(tmp_path: Path) -> None:
    text = (
        RECIPE.format(line="  time: '10'")
        + "launcher: accelerate\nparallelism: {fsdp: {auto_wrap: llama.LlamaDecoderLayer}}\n"
    )
    recipe, errors, code = _errors(tmp_path, text)
    assert code == 2
    assert errors == [
        f"{recipe}:9: parallelism.fsdp.auto_wrap: must be letters, digits and '_' only, not starting with a digit"
    ]


def test_a_cluster_profile_value_of_the_wrong_format_names_the_profile_line(tmp_path: Path) -> None:
    profile = tmp_path / "site.yaml"
    profile.write_text("name: site\ngpus_per_node: 2\ncpus_per_node: 8\nmax_time: 2d\n")
    text = RECIPE.format(line="  time: '10'") + f"cluster: {profile}\n"
    _, errors, code = _errors(tmp_path, text)
    assert code == 2 and errors == [f"{profile}:4: max_time: {TIME}"]
    profile.write_text("name: site\ngpus_per_node: 2\ncpus_per_node: 8\nmem_per_node: 512GB\n")
    _, errors, code = _errors(tmp_path, text)
    assert code == 2 and errors == [f"{profile}:4: mem_per_node: {MEMORY}"]


def _patterns(schema: object) -> set[str]:
    if isinstance(schema, dict):
        own = {schema["pattern"]} if isinstance(schema.get("pattern"), str) else set()
        return own | {p for value in schema.values() for p in _patterns(value)}
    if isinstance(schema, list):
        return {p for value in schema for p in _patterns(value)}
    return set()


def test_every_pattern_of_a_recipe_or_profile_has_a_hint() -> None:
    """A new pattern without a hint would print its regex to the user."""
    _, components = msgspec.json.schema_components((Recipe, ClusterProfile))
    assert _patterns(components) - PATTERN_HINTS.keys() == set()

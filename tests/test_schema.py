"""`clusterkit schema [--profile]`: the JSON Schemas editors check recipes and cluster profiles with.
Checked with a real JSON Schema validator (jsonschema, the [test] extra): every shipped file passes
as an editor reads it (YAML 1.2-ish, PyYAML here) and as clusterkit reads it, and a typo'd key or a
wrong type is flagged as clusterkit flags it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterkit.load.yaml_source import load_yaml_file
from conftest import REPO, run_cli

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the [test] extra (bin/setup)")

PROFILES = sorted(REPO.glob("recipes/clusters/*.yaml")) + sorted(REPO.glob("recipes/ported/clusters/*.yaml"))
RECIPES = sorted(REPO.glob("recipes/*.yaml")) + sorted(REPO.glob("recipes/ported/*.yaml"))


def _schema(*flags: str) -> dict:
    done = run_cli("schema", *flags)
    assert done.returncode == 0 and not done.stderr, done.stderr
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.fixture(scope="module")
def profile_validator() -> jsonschema.Draft202012Validator:
    schema = _schema("--profile")
    assert schema["title"] == "clusterkit cluster profile" and schema["$ref"] == "#/$defs/ClusterProfile"
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def recipe_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


def _problems(validator: jsonschema.Draft202012Validator, data: object) -> list[str]:
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(data)]


@pytest.mark.parametrize("path", PROFILES, ids=[str(p.relative_to(REPO)) for p in PROFILES])
def test_a_shipped_profile_passes_its_schema(profile_validator, path: Path) -> None:
    assert _problems(profile_validator, yaml.safe_load(path.read_text())) == []
    assert _problems(profile_validator, load_yaml_file(path)[0]) == []


@pytest.mark.parametrize("path", RECIPES, ids=[str(p.relative_to(REPO)) for p in RECIPES])
def test_a_shipped_recipe_passes_its_schema(recipe_validator, path: Path) -> None:
    assert _problems(recipe_validator, yaml.safe_load(path.read_text())) == []


def test_a_typo_and_a_wrong_type_in_a_profile_are_flagged(profile_validator, tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    typo = {**profile, "gpus_per_nod": 2}
    assert any("gpus_per_nod" in problem for problem in _problems(profile_validator, typo))
    nested = {**profile, "login": {"host": "hpc-login", "transprt": "openssh"}}
    assert any(p.startswith("login:") and "transprt" in p for p in _problems(profile_validator, nested))
    wrong = {**profile, "interconnect": "token-ring", "gpus_per_node": "two"}
    assert {p.split(":")[0] for p in _problems(profile_validator, wrong)} == {"interconnect", "gpus_per_node"}
    # clusterkit itself refuses the same typo, in one line (the schema is the loader's, not a copy)
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**typo, "name": "typo"}))
    recipe = str(REPO / "recipes" / "tiny-gpt2-cpu.yaml")
    done = run_cli("validate", recipe, "--set", f"cluster={tmp_path / 'typo.yaml'}")
    assert done.returncode == 2 and "gpus_per_nod" in done.stderr, done.stderr


def test_the_profile_schema_is_not_the_recipes(recipe_validator, profile_validator) -> None:
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    assert _problems(recipe_validator, profile), "a profile is not a recipe"
    assert _problems(profile_validator, {"name": "r", "cluster": "dev"}), "a recipe is not a profile"

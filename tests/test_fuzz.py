"""Property: any recipe or profile either renders or is refused with one-line errors and exit code 2;
never a traceback, never a partial output directory, never a submitted job (the scheduler is never
reached: `render` is the same path up to submission). A few hundred cases here; bench/fuzz_recipes.py
runs 10,000 per strategy and the hostile-field property (tests/hostile_fields.py) 20,000 times."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings

from clusterkit.cli.main import main
from recipe_strategies import anything, profiles, recipes

ONE_LINE_ERROR = re.compile(r"^[^\n]+: \S.*$")


def check_recipe(recipe: object, profile: object | None = None) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ck-fuzz-"))
    try:
        if profile is not None and isinstance(recipe, dict):
            (workdir / "profile.yaml").write_text(yaml.safe_dump(profile, allow_unicode=True))
            recipe = {**recipe, "cluster": "profile.yaml"}
        path = workdir / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
        out = workdir / "out"
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["render", str(path), "-o", str(out)])
        errors = stderr.getvalue().splitlines()
        if code == 0:
            assert (out / "job.sbatch").is_file()
        else:
            assert code == 2, (code, stderr.getvalue())
            assert not out.exists(), "a refused recipe wrote output"
            assert errors and all(ONE_LINE_ERROR.match(line) for line in errors), stderr.getvalue()
        assert "Traceback" not in stderr.getvalue()
        assert [p.name for p in workdir.iterdir() if p.name.startswith(".out")] == [], "staging left behind"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(recipes)
def test_fuzzed_recipes(recipe: object) -> None:
    check_recipe(recipe)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(anything)
def test_fuzzed_files_of_any_structure(content: object) -> None:
    check_recipe(content)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(recipes, profiles)
def test_fuzzed_profiles(recipe: object, profile: object) -> None:
    check_recipe(recipe, profile)

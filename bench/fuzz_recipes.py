"""Fuzz clusterkit with 10,000 generated recipes and profiles (CI runs a few hundred): every one must
render or be refused with one-line errors and exit code 2 — no traceback, no partial output.

    python bench/fuzz_recipes.py [--examples 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from recipe_strategies import anything, profiles, recipes  # noqa: E402
from test_fuzz import check_recipe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=10_000)
    n = parser.parse_args().examples
    fuzz = settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    start = time.time()
    def recipe_alone(recipe: object) -> None:
        check_recipe(recipe)

    def recipe_with_profile(recipe: object, profile: object) -> None:
        check_recipe(recipe, profile)

    fuzz(given(recipes)(recipe_alone))()
    fuzz(given(recipes, profiles)(recipe_with_profile))()
    fuzz(given(anything)(recipe_alone))()
    print(f"{3 * n} fuzzed recipes/profiles: all rendered or refused cleanly ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()

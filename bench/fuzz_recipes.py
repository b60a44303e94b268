"""Fuzz clusterkit at scale (CI runs a few hundred of each):

1. generated recipes and profiles of any shape: every one renders or is refused with one-line errors
   and exit code 2 — no traceback, no partial output;
2. a hostile string in any string field, through the file or --set (tests/hostile_fields.py): refused
   with one line, or rendered into a script that bash -n and shellcheck accept and that, executed
   with stub srun/scontrol, runs nothing and writes only its run directory.

    python bench/fuzz_recipes.py [--examples 10000] [--hostile 20000] [--no-shellcheck]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from hostile_fields import cases, check_case  # noqa: E402
from recipe_strategies import anything, profiles, recipes  # noqa: E402
from test_fuzz import check_recipe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=10_000, help="structural cases per strategy (3 strategies)")
    parser.add_argument("--hostile", type=int, default=20_000, help="hostile-field cases, each executed by bash")
    parser.add_argument("--no-shellcheck", action="store_true", help="bash -n and execution only (faster)")
    options = parser.parse_args()
    n = options.examples
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

    canary = Path(tempfile.mkdtemp(prefix="ck-canary-"))
    outcomes: Counter[str] = Counter()

    def hostile(case) -> None:
        outcomes[check_case(case, canary, shellcheck=not options.no_shellcheck)] += 1

    start = time.time()
    settings(fuzz, max_examples=options.hostile)(given(cases(str(canary)))(hostile))()
    print(
        f"{sum(outcomes.values())} hostile field values: {outcomes['refused']} refused with one line, "
        f"{outcomes['executed']} rendered and executed inert ({time.time() - start:.0f} s)"
    )


if __name__ == "__main__":
    main()

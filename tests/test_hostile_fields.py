"""Issue 11's core promise, property-tested: a hostile string in any string field of a recipe or
profile (file or --set) is refused with one line and exit 2, or renders a script that bash and
shellcheck accept and that, executed with stub srun/scontrol, runs nothing and writes only its run
directory. See tests/hostile_fields.py; bench/fuzz_recipes.py runs the same property at scale."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterkit.spec.recipe import LINE_BREAKING
from hostile_fields import KEY, PROFILE_FIELDS, RECIPE_FIELDS, Case, cases, check_case

CANARY = Path("/tmp/clusterkit-hostile-canary")


@pytest.fixture(scope="module", autouse=True)
def _canary_dir() -> None:
    CANARY.mkdir(exist_ok=True)
    for leftover in CANARY.iterdir():
        leftover.unlink()


def test_every_one_line_field_is_found() -> None:
    """The fuzzer reaches the fields issue 11 named (a walk that found nothing would pass vacuously)."""
    for path in [
        ("name",),
        ("runs_dir",),
        ("resources", "partition"),
        ("resources", "account"),
        ("resources", "qos"),
        ("resources", "constraint"),
        ("resources", "reservation"),
        ("resources", "mem"),
        ("resources", "time"),
        ("resources", "extra_sbatch", KEY),
        ("resources", "extra_sbatch", "x"),
        ("env", KEY),
        ("python",),
        ("steps", 0, "name"),
        ("steps", 0, "task", "args", 0),
        ("steps", 0, "launcher_args", 0),
        ("steps", 0, "env", KEY),
        ("steps", 0, "env", "x"),
        ("steps", 0, "srun", "extra", "x"),
    ]:
        assert path in RECIPE_FIELDS, path
    for path in [("partition",), ("account",), ("runs_dir",), ("modules", 0), ("container", "image")]:
        assert path in PROFILE_FIELDS, path


@pytest.mark.parametrize(
    "path",
    [
        ("name",),
        ("runs_dir",),
        ("resources", "partition"),
        ("resources", "time"),
        ("resources", "mem"),
        ("resources", "extra_sbatch", "x"),
        ("resources", "extra_sbatch", KEY),
        ("env", KEY),
    ],
)
@pytest.mark.parametrize("end", ["\n", "\r", "\u2028", "\u2029", "\x85", "\x00", "\r\n"])
@pytest.mark.parametrize("via_set", [False, True])
def test_a_trailing_line_break_is_refused(path: tuple, end: str, via_set: bool) -> None:
    """The exact hole: `$` matched before a final newline, so 'p\\n' validated and broke the header."""
    value = ("10" if path == ("resources", "time") else "1G" if path == ("resources", "mem") else "p") + end
    assert check_case(Case("recipe", path, value, "script", via_set), CANARY, shellcheck=False) == "refused"


@pytest.mark.parametrize("path", [("partition",), ("account",), ("runs_dir",), ("modules", 0)])
def test_profile_line_breaks_are_refused(path: tuple) -> None:
    assert check_case(Case("profile", path, "p\n", "script", False), CANARY, shellcheck=False) == "refused"


# Cases the fuzz benchmark found; each once gave something other than one line and exit 2 or a clean run.
FOUND_BY_FUZZING = [
    Case("recipe", ("runs_dir",), "-", "script", False),  # mkdir read it as an option
    Case("recipe", ("task", "trainer", "model", "config"), "~'", "script", False),  # pathlib: no home for user "'"
    Case("recipe", ("cluster",), "~nobody-here/p.yaml", "script", True),
    Case("recipe", ("task", "args", 0), "\r", "script", False),  # the check itself read "\r" back as "\n"
    Case("recipe", ("env", "x"), "a\rb", "script", True),
]


# A job of several steps: a step's own fields, hostile (in a step's env, {trial} is expanded late);
# each reaches its program exactly, nothing runs.
STEP_CASES = [
    Case("recipe", path, value.replace("CANARY", str(CANARY)), "steps", False)
    for path in (("steps", 0, "task", "args", 0), ("steps", 0, "launcher_args", 0), ("steps", 0, "env", "x"))
    for value in ("$(touch CANARY/s);`touch CANARY/b`'\"", "{trial}\\{run_dir} %j ~ -", "a\rb")
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: ".".join(map(str, case.path)) + repr(case.value)[:12])
def test_hostile_values_in_a_step(case: Case) -> None:
    assert check_case(case, CANARY) == "executed"


@pytest.mark.parametrize("case", FOUND_BY_FUZZING, ids=lambda case: ".".join(map(str, case.path)))
def test_cases_found_by_fuzzing(case: Case) -> None:
    check_case(case, CANARY)


# The script's arguments after `--` (issue 31) and {env:NAME} filled in where the job runs (the job's
# environment sets CK_HOSTILE to a hostile value: hostile_fields.ENV_VALUE).
ARGS_AND_SITE_VALUES = [
    (Case("args", ("--",), "$(touch CANARY/a)`touch CANARY/b`;touch CANARY/c", "script", False), "executed"),
    (Case("args", ("--",), "--set\n'\"\\ *é", "script", False), "executed"),
    (Case("args", ("--",), "a\x00b", "script", False), "refused"),  # no argument can hold a NUL
    (Case("args", ("--",), "{env:CK_HOSTILE}", "script", False), "executed"),
    (Case("recipe", ("task", "args", 0), "--x={env:CK_HOSTILE}/y", "script", True), "executed"),
    (Case("recipe", ("env", "x"), "a{env:CK_HOSTILE}b", "script", False), "executed"),
    (Case("recipe", ("env", "x"), "{env:CK_HOSTILE", "script", False), "refused"),  # malformed
    (Case("profile", ("container", "image"), "{env:CK_HOSTILE}/img.sqsh", "script", False), "executed"),
    (Case("profile", ("container", "mounts", 0), "{env:CK_HOSTILE}:/data", "script", False), "executed"),
]


@pytest.mark.parametrize(
    ("case", "outcome"),
    ARGS_AND_SITE_VALUES,
    ids=[f"{c.target}:{c.path[-1]}:{c.value!r}" for c, _ in ARGS_AND_SITE_VALUES],
)
def test_arguments_and_site_values_are_text(case: Case, outcome: str) -> None:
    value = case.value.replace("CANARY", str(CANARY))
    assert check_case(Case(case.target, case.path, value, case.base, case.via_set), CANARY) == outcome
    assert sorted(CANARY.iterdir()) == []


def test_module_names_are_values_not_shell() -> None:
    value = f"mod$(touch {CANARY}/module);touch {CANARY}/module2"
    assert check_case(Case("profile", ("modules", 0), value, "script", False), CANARY) == "executed"


def test_the_header_renderer_refuses_line_breaks_itself() -> None:
    """Defence in depth: even a value that bypassed the types cannot open a shell line in #SBATCH."""
    from clusterkit.render.shell import UnsafeValue, one_line

    for ch in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00":
        with pytest.raises(UnsafeValue):
            one_line(f"p{ch}")
    assert one_line("a b\tc$(x)") == "a b\tc$(x)"
    assert all(f"{chr(c)}" for c in range(0x20))  # the set below is the types' set
    assert "\\x0a-\\x1f" in LINE_BREAKING


@settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_hostile_string_in_any_field(data: st.DataObject) -> None:
    check_case(data.draw(cases(str(CANARY))), CANARY)


@pytest.mark.parametrize(
    "path, value",
    [
        (("task", "program"), "./$(touch CANARY/program)"),
        (("task", "program"), "`touch CANARY/backtick`;x"),
        (("task", "program"), "-x"),
        (("task", "program"), "./a b;>CANARY/redirect"),
        (("task", "program"), "{rank}"),
        (("task", "args", 0), "$(touch CANARY/arg) '\"\\ {x}%j ~ -"),
        (("task", "args", 0), "\r"),
    ],
)
@pytest.mark.parametrize("base", ["program", "front_end"])
def test_a_programs_path_and_arguments_are_words_not_shell(path: tuple, value: str, base: str) -> None:
    """task.program is exec'd by the node agent (or started by the supervisor, as a front end in the
    batch shell) as one word; a name that is not there fails to start (127), and each argument
    reaches the program byte for byte."""
    case = Case("recipe", path, value.replace("CANARY", str(CANARY)), base, False)
    assert check_case(case, CANARY) == "executed"

"""One error taxonomy: every error clusterkit reports is a UserError (exit 2) or an ExternalError
(exit 1), mapped to its exit code and its one escaped line in one place (cli.main). Also: importing
clusterkit (as every training rank does) stays light, and no process that converted recipe types
crashes on its way out (msgspec issue #717)."""

from __future__ import annotations

import errno
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import clusterkit
from clusterkit.cli import main as cli
from clusterkit.cli import recipes as cli_recipes
from clusterkit.errors import (
    ClusterkitError,
    ExternalError,
    Finding,
    LocatedError,
    Location,
    RecipeError,
    RecipeErrors,
    UserError,
)
from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
HOSTILE = "bad\nline\x1b[31m\x07 end"
HOSTILE_SHOWN = "bad\\nline\\x1b[31m\\x07 end"
# Modules that run inside the job (their errors end the rank, through torchrun's error file; the
# supervisor's end the job with a line in its log) and exceptions that never leave the module that catches them.
RUNTIME = ("clusterkit.runtime", "clusterkit.supervisor")
INTERNAL = {"UnknownArchitecture"}  # the planner turns it into a PlanError


def _cli_modules() -> list:
    names = [info.name for info in pkgutil.walk_packages(clusterkit.__path__, "clusterkit.")]
    return [
        importlib.import_module(name)
        for name in names
        if not name.startswith(RUNTIME) and not name.endswith("__main__")
    ]


def _all_subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _all_subclasses(sub)
    return found


def test_every_error_outside_the_job_is_a_user_error_or_an_external_error() -> None:
    for module in _cli_modules():
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                if name in INTERNAL or obj in (ClusterkitError, UserError, ExternalError):
                    continue
                assert issubclass(obj, (UserError, ExternalError)), f"{module.__name__}.{name} has no kind"
                assert not (issubclass(obj, UserError) and issubclass(obj, ExternalError)), name


def _raise(error: BaseException):
    def command(_args) -> int:
        raise error

    return command


def _concrete_errors() -> list[type[ClusterkitError]]:
    _cli_modules()  # every subclass defined
    return sorted(
        (
            c
            for c in _all_subclasses(ClusterkitError)
            if not issubclass(c, LocatedError) and c not in (UserError, ExternalError)
        ),
        key=lambda c: c.__qualname__,
    )


@pytest.mark.parametrize("error_class", _concrete_errors(), ids=lambda c: c.__name__)
def test_main_maps_each_error_to_its_code_and_one_escaped_line(
    error_class: type[ClusterkitError], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(error_class(f"{HOSTILE}")))
    code = cli.main(["schema"])
    assert code == (2 if issubclass(error_class, UserError) else 1)
    assert capsys.readouterr().err == f"clusterkit: {HOSTILE_SHOWN}\n"


def test_errors_located_in_a_file_print_their_own_file_line_key_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    findings = [
        Finding(Location("r.yaml", 3), ("resources", "nodes"), HOSTILE),
        Finding(Location("r.yaml", 9), ("name",), "too long"),
    ]
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(RecipeErrors(findings)))
    assert cli.main(["schema"]) == 2
    assert capsys.readouterr().err == f"r.yaml:3: resources.nodes: {HOSTILE_SHOWN}\nr.yaml:9: name: too long\n"
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(RecipeError(findings[1])))
    assert cli.main(["schema"]) == 2
    assert capsys.readouterr().err == "r.yaml:9: name: too long\n"
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(LocatedError(f"r.yaml: {HOSTILE}")))
    assert cli.main(["schema"]) == 2
    assert capsys.readouterr().err == f"r.yaml: {HOSTILE_SHOWN}\n"


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/x"), 1, "No space left on device: /data/x"),
        (OSError(errno.EIO, "Input/output error"), 1, "Input/output error"),
        (
            FileNotFoundError(errno.ENOENT, "No such file or directory", f"/tmp/{HOSTILE}"),
            2,
            f"No such file or directory: /tmp/{HOSTILE_SHOWN}",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), 2, "Permission denied: /root/x"),
    ],
)
def test_a_stray_os_error_is_the_users_path_or_the_machines(
    error: OSError, code: int, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(error))
    assert cli.main(["schema"]) == code
    assert capsys.readouterr().err == f"clusterkit: {line}\n"


def test_ctrl_c_exits_130_quietly(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_recipes, "cmd_schema", _raise(KeyboardInterrupt()))
    assert cli.main(["schema"]) == 130 and capsys.readouterr().err == ""


def test_old_builtins_still_catch_the_errors_that_replaced_them() -> None:
    from clusterkit.errors import PathError, RunNotFound, SSHError, SubmitError, UnsafeValue

    assert issubclass(RunNotFound, LookupError) and issubclass(PathError, LookupError)
    assert issubclass(SubmitError, RuntimeError) and issubclass(SSHError, RuntimeError)
    assert issubclass(UnsafeValue, ValueError)


def test_arguments_that_do_not_go_together_are_user_errors(tmp_path: Path) -> None:
    nothing = run_cli("submit")
    assert nothing.returncode == 2 and nothing.stderr == "clusterkit: give a RECIPE, or --resume RUN_DIR\n"
    unknown = run_cli("status", "no\nsuch\x1bjob", "--runs-dir", str(tmp_path))
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert unknown.stderr.startswith("clusterkit: no run with job id no\\nsuch\\x1bjob under ")


def _fresh(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return set(done.stdout.split())


LIGHT = ("jinja2", "yaml", "paramiko", "rich", "torch", "transformers", "submitit", "msgspec")


def test_importing_clusterkit_imports_nothing_heavy() -> None:
    for code in (
        "import clusterkit",
        "import clusterkit.runs.checkpoint_files",
        "from clusterkit import RecipeError, UserError",
    ):
        loaded = _fresh(code)
        assert not [m for m in LIGHT if m in loaded], code
        assert not {"clusterkit.load.loader", "clusterkit.render.job"} & loaded, code


def test_a_training_rank_does_not_import_the_loader_or_the_renderer() -> None:
    loaded = _fresh("import clusterkit.runtime.checkpoints")  # torch and transformers, nothing of the CLI
    assert (
        not {"clusterkit.load.loader", "clusterkit.render.job", "clusterkit.load.yaml_source", "paramiko", "rich"}
        & loaded
    )


def test_validate_imports_no_template_engine() -> None:
    loaded = _fresh(f"from clusterkit.cli.main import main; main(['validate', '-q', {str(TINY)!r}])")
    assert not {"jinja2", "jinja2.environment", "clusterkit.render.job", "paramiko", "rich", "torch"} & loaded


def test_the_public_names_load_on_first_use() -> None:
    from clusterkit import RecipeError as public_error
    from clusterkit import load_recipe, render_job

    assert public_error is RecipeError and render_job(load_recipe(TINY)).files["job.sbatch"]
    assert {"load_recipe", "render_job", "RecipeError"} <= set(dir(clusterkit))
    with pytest.raises(AttributeError):
        clusterkit.no_such_name  # noqa: B018


def test_no_exit_crashes_after_recipe_types_were_used() -> None:
    """msgspec #717 crashed every such exit (SIGABRT) before the types were frozen at exit."""
    from clusterkit.load.loader import load_recipe
    from clusterkit.spec.resolved import JobFile

    loaded = load_recipe(TINY)
    job_json = msgspec.json.encode(JobFile(recipe=loaded.recipe, profile=loaded.profile))
    for code in (
        f"from clusterkit import load_recipe; load_recipe({str(TINY)!r}); raise SystemExit(3)",
        # a rank reads job.json without the loader; a failing one exits the usual way
        "import sys; from clusterkit.spec.resolved import decode_job_file; "
        "decode_job_file(sys.stdin.buffer.read()); raise SystemExit(3)",
    ):
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", code], input=job_json, capture_output=True, cwd=REPO)
            assert done.returncode == 3, (code, done.returncode, done.stderr[-300:])


# A process whose exit-time collection takes a while (a list of 30 M references, walked by every full
# collection), saying on its stdout when that collection starts; clusterkit's handler runs it.
_SLOW_EXIT = """
import atexit, gc, os, sys
from clusterkit import load_recipe
load_recipe(sys.argv[1])
alive = [0] * 30_000_000

def say_collecting(phase, info):
    if phase == "start" and info["generation"] == 2:
        gc.callbacks.remove(say_collecting)
        os.write(1, b"collecting\\n")

atexit.register(gc.callbacks.append, say_collecting)  # runs before clusterkit's handler (last in, first out)
"""


def test_ctrl_c_during_the_exit_time_collection_exits_130() -> None:
    """A KeyboardInterrupt out of the collection that keeps msgspec #717 away skipped the freeze, and
    the interpreter crashed (double free, SIGABRT/SIGSEGV); now the exit says it was interrupted."""
    import signal
    import time

    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", _SLOW_EXIT, str(TINY)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert child.stdout.readline() == b"collecting\n"
        time.sleep(0.02)  # inside the collection (C code: the signal waits for it to return)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        assert (child.returncode, err) == (130, b"")

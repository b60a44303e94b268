"""Issue 31, arguments and site values: ``submit RECIPE -- ARGS...`` hands ARGS to the script after
task.args, word for word, byte for byte (one more input of the resolved recipe, so the dry run, the
render and the run record say exactly what runs); ``{env:NAME}`` in task args, env values and the
container's image and mounts is filled in where the job runs, by clusterkit's Python, never a shell.
Jobs run on the local executor here (the same batch script, supervisor and node agent as on SLURM);
their twin on the dev cluster is test_slurm_program_args.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterkit.cli.main import main
from conftest import REPO, run_cli

SCRIPT = REPO / "tests" / "scripts" / "argv_json.py"
# Words that look like shell, like clusterkit's own options, like YAML, or like nothing at all.
HOSTILE_ARGS = [
    "--lr",
    "3e-4",
    "--",
    "--set",
    "resources.nodes=9",
    "--executor",
    "ssh",
    "--dry-run",
    "-h",
    "",
    " ",
    "a b",
    "$(touch CANARY/dollar)",
    "`touch CANARY/backtick`",
    ";touch CANARY/semicolon",
    "$HOME",
    "${HOME}",
    "'",
    '"',
    "\\",
    "*",
    "~",
    "line1\nline2",
    "\t",
    "é😀",
    "{x}",
    "{{ 7*7 }}",
    "null",
    "yes",
    "[a, b]",
    "a: b",
    "#c",
    "-",
]


def _recipe(tmp_path: Path, **fields: object) -> Path:
    recipe = {
        "name": "args",
        "launcher": "python",
        "resources": {"nodes": 1, "gpus_per_node": 1, "time": "5"},
        "task": {"script": str(SCRIPT), "args": ["--from-recipe", "r 1"]},
        "snapshot": False,
        "runs_dir": str(tmp_path / "runs"),
    }
    recipe.update(fields)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _dry_run(recipe: Path, *argv: str) -> dict:
    code, out, err = _cli("submit", str(recipe), "--executor", "local", "--dry-run", "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def _launch_argv(files: dict, plan: str = "plan.json") -> list[str]:
    return json.loads(files[plan])["launch"]["argv"]


def _tail(argv: list[str], n: int) -> list[str]:
    return argv[len(argv) - n :] if n else []


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        ["--lr", "3e-4"],
        ["--", "x"],  # a second "--" is the script's
        ["--set", "resources.nodes=9", "--executor", "ssh", "--dry-run", "--json", "-h", "--help"],
        ["RECIPE.yaml", "--resume", "/x"],
        [""],
    ],
    ids=["lr", "second-dashes", "clusterkit-options", "positional-like", "empty"],
)
def test_the_words_after_dashes_are_the_scripts_whatever_they_look_like(tmp_path: Path, words: list[str]) -> None:
    request = _dry_run(_recipe(tmp_path), "--", *words)
    assert request["scheduler"] == "local"  # --executor ssh went to the script, not to submit
    assert _tail(_launch_argv(request["files"]), len(words) + 2) == ["--from-recipe", "r 1", *words]
    resolved = yaml.safe_load(request["files"]["recipe.resolved.yaml"].split("\n", 1)[1])
    assert resolved["task"]["args"] == ["--from-recipe", "r 1", *words]
    assert resolved["resources"]["nodes"] == 1


def test_no_dashes_no_arguments_and_options_may_come_after_the_recipe(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    plain = _launch_argv(_dry_run(recipe)["files"])
    assert plain[-2:] == ["--from-recipe", "r 1"]
    code, out, _ = _cli("submit", "--dry-run", "--json", "--executor", "local", str(recipe), "--", "--lr", "1")
    assert code == 0 and _launch_argv(json.loads(out)["files"]) == [*plain, "--lr", "1"]
    # "--" with nothing after it: no arguments
    assert _launch_argv(_dry_run(recipe, "--")["files"]) == plain


def test_the_dry_run_shows_them_quoted(tmp_path: Path) -> None:
    code, _, err = _cli("submit", str(_recipe(tmp_path)), "--executor", "local", "--dry-run", "--", "a b", "$(x)")
    assert code == 0
    launch = next(line for line in err.splitlines() if line.startswith("# launch:"))
    assert launch.endswith("--from-recipe 'r 1' 'a b' '$(x)'"), launch


def test_render_takes_them_too(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, _, err = _cli("render", str(_recipe(tmp_path)), "-o", str(out), "--", "--lr", "3e-4", "-o", "elsewhere")
    assert code == 0, err
    argv = json.loads((out / "plan.json").read_text())["launch"]["argv"]
    assert argv[-6:] == ["--from-recipe", "r 1", "--lr", "3e-4", "-o", "elsewhere"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_sweep_gives_every_point_the_same_arguments(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    code, out, err = _cli(
        "sweep",
        str(recipe),
        "--grid",
        "env.POINT=1,2",
        "--executor",
        "local",
        "--dry-run",
        "--json",
        "--",
        "--lr",
        "3e-4",
    )
    assert code == 0, err
    request = json.loads(out)
    plans = sorted(name for name in request["files"] if name.endswith("plan.json"))
    assert plans == ["0/plan.json", "1/plan.json"]
    for plan in plans:
        assert _launch_argv(request["files"], plan)[-4:] == ["--from-recipe", "r 1", "--lr", "3e-4"]


def test_the_python_api_takes_them_as_a_list(tmp_path: Path) -> None:
    import clusterkit
    from clusterkit.errors import UsageError

    request = clusterkit.dry_run(str(_recipe(tmp_path)), executor="local", args=["--lr", "3e-4"])
    assert _launch_argv(request.files)[-2:] == ["--lr", "3e-4"]
    assert request.overrides == ('task.args+=["--lr", "3e-4"]',)  # what the run record keeps
    with pytest.raises(UsageError, match="a list of arguments"):
        clusterkit.dry_run(str(_recipe(tmp_path)), executor="local", args="--lr 3e-4")
    with pytest.raises(UsageError, match="argument 2 holds a NUL character"):
        clusterkit.dry_run(str(_recipe(tmp_path)), executor="local", args=["a", "b\0c"])


def test_a_word_that_is_no_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", "submit", str(_recipe(tmp_path)), "--dry-run", "--", b"a\xffb"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip() == "error: the arguments after --: argument 1 is not UTF-8 text" or (
        done.stderr.decode().strip().endswith("argument 1 is not UTF-8 text")
        and len(done.stderr.decode().strip().splitlines()) == 1
    ), done.stderr


def test_the_trainer_runner_takes_no_arguments(tmp_path: Path) -> None:
    trainer = {"trainer": {"model": {"config": {"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8}}}}
    recipe = _recipe(tmp_path, task=trainer, launcher="torchrun")
    code, _, err = _cli("submit", str(recipe), "--dry-run", "--", "--lr", "3e-4")
    assert code == 2
    assert err.strip().splitlines() == [
        "the arguments after --: task.args[0]: task.args (and the arguments after --) go to task.script's program; "
        "the built-in Trainer runner takes none: set TrainingArguments in task.trainer.args "
        "(--set task.trainer.args.learning_rate=3e-4)"
    ], err


def test_a_run_value_in_an_argument_is_one_as_in_task_args(tmp_path: Path) -> None:
    """The words after -- are task.args: {run_dir} and {env:NAME} are filled in, and checked alike."""
    code, _, err = _cli("submit", str(_recipe(tmp_path)), "--dry-run", "--", "{env:}")
    assert code == 2
    assert err.strip() == (
        "the arguments after --: task.args[2]: {env:} names no environment variable: "
        "write {env:NAME}, NAME letters, digits and _"
    ), err
    code, _, err = _cli(
        "submit", str(_recipe(tmp_path, launcher="torchrun")), "--dry-run", "--", "--local-rank={local_rank}"
    )
    assert code == 2 and "task.args[2]: {local_rank} is known only in a task per rank" in err, err


# -- what the job runs ------------------------------------------------------------------------------


def _submit(recipe: Path, *argv: str, env: dict[str, str] | None = None) -> Path:
    done = run_cli("submit", str(recipe), "--executor", "local", *argv, cwd=recipe.parent, env=env)
    assert done.returncode == 0, done.stderr
    return Path(next(line for line in done.stdout.splitlines() if line.startswith("run dir: ")).split(": ", 1)[1])


def _ended(run_dir: Path, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while not (run_dir / "exit_code").exists() and time.time() < deadline:
        time.sleep(0.3)
    return (run_dir / "exit_code").read_text().strip()


def _seen(run_dir: Path, rank: int = 0) -> dict:
    return json.loads((run_dir / "argv" / f"rank-{rank}.json").read_text())


def test_the_arguments_reach_the_script_byte_for_byte(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    words = [word.replace("CANARY", str(canary)) for word in HOSTILE_ARGS]
    run_dir = _submit(_recipe(tmp_path), "--", *words)
    code = _ended(run_dir)
    assert code == "0", (run_dir / f"{run_dir.name}_0_log.err").read_text()
    seen = _seen(run_dir)
    expected = ["--from-recipe", "r 1", *words]
    assert seen["argv"] == expected
    assert seen["argv_hex"] == [word.encode().hex() for word in expected]
    assert sorted(os.listdir(canary)) == []
    # The run record keeps them (a --resume runs them again); the resolved recipe says them.
    record = json.loads((run_dir / "run.json").read_text())
    assert [o for o in record["overrides"] if o.startswith("task.args+=")] == [
        "task.args+=" + json.dumps(words, ensure_ascii=False)
    ]
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    assert resolved["task"]["args"] == expected


def _earlier_run(tmp_path: Path, recipe: Path, overrides: list[str]) -> Path:
    run_dir = tmp_path / "earlier"
    run_dir.mkdir()
    record = {
        "job_id": "7",
        "name": "args",
        "scheduler": "local",
        "run_dir": str(run_dir),
        "recipe": str(recipe),
        "submitted_at": 0.0,
        "nodes": 1,
        "ranks_per_node": 1,
        "launcher": "python",
        "overrides": overrides,
    }
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def test_a_resume_keeps_the_earlier_arguments_unless_given_again(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    earlier = _earlier_run(tmp_path, recipe, ['task.args+=["--lr", "3e-4", "é😀"]', "env.A=1"])
    again = _dry_run(recipe, "--resume", str(earlier), "--from-scratch")
    assert _launch_argv(again["files"])[-5:] == ["--from-recipe", "r 1", "--lr", "3e-4", "é😀"]
    replaced = _dry_run(recipe, "--resume", str(earlier), "--from-scratch", "--", "--lr", "1e-4")
    assert _launch_argv(replaced["files"])[-4:] == ["--from-recipe", "r 1", "--lr", "1e-4"]
    cleared = _dry_run(recipe, "--resume", str(earlier), "--from-scratch", "--")
    assert _launch_argv(cleared["files"])[-2:] == ["--from-recipe", "r 1"]
    assert "A" in yaml.safe_load(cleared["files"]["recipe.resolved.yaml"].split("\n", 1)[1])["env"]


# The value a site sets: shell, quotes, a line break, and a run-time value of its own (never expanded again).
SITE_VALUE = "/scratch/$(touch CANARY/site) 'q' \"d\" `touch CANARY/bt`\nline2 {env:HOME} {run_dir}"


def test_env_references_are_filled_in_on_each_node_as_text(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.mkdir()
    site = SITE_VALUE.replace("CANARY", str(canary))
    recipe = _recipe(
        tmp_path,
        resources={"nodes": 2, "gpus_per_node": 1, "time": "5"},
        task={"script": str(SCRIPT), "args": ["--data={env:CK_SITE}/data", "{env:SLURMD_NODENAME}"]},
        env={"CK_DATA": "{env:CK_SITE}/y", "CK_NODE": "on {env:SLURMD_NODENAME}", "ARGV_JSON_ENV": "CK_DATA,CK_NODE"},
    )
    run_dir = _submit(recipe, "--", "{env:CK_SITE}", env={**os.environ, "CK_SITE": site})
    assert _ended(run_dir) == "0", (run_dir / f"{run_dir.name}_0_log.err").read_text()
    for rank in (0, 1):
        seen = _seen(run_dir, rank)
        node = seen["node"]
        assert node == f"127.0.0.{rank + 1}"
        assert seen["argv"] == [f"--data={site}/data", node, site]
        assert seen["argv_hex"][0] == f"--data={site}/data".encode().hex()
        assert seen["env"] == {"CK_DATA": f"{site}/y", "CK_NODE": f"on {node}"}
    assert sorted(os.listdir(canary)) == []
    # Written as the recipe has it: the job's files hold the reference, not the value.
    script = (run_dir / "job.sbatch").read_text()
    assert "export CK_DATA='{env:CK_SITE}/y'" in script and "/scratch/" not in script


def test_an_unset_variable_fails_the_job_with_a_line_naming_it(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, task={"script": str(SCRIPT), "args": ["{env:CK_NEVER_SET_ANYWHERE}/x"]})
    env = {name: value for name, value in os.environ.items() if name != "CK_NEVER_SET_ANYWHERE"}
    run_dir = _submit(recipe, env=env)
    assert _ended(run_dir) == "2"
    assert not (run_dir / "argv").exists()  # the script never started
    log = (run_dir / f"{run_dir.name}_0_log.err").read_text()
    line = "{env:CK_NEVER_SET_ANYWHERE} in the launch step: the variable CK_NEVER_SET_ANYWHERE is not set on 127.0.0.1"
    assert f"clusterkit: {line}" in log, log
    status = run_cli("status", str(run_dir), cwd=tmp_path)
    assert "FAILED" in status.stdout and f"first failure: node 0, 127.0.0.1: {line}" in status.stdout, status.stdout

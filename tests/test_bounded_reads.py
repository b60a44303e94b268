"""Files clusterkit reads that a user named or another process keeps (a recipe and the recipes it
extends, a cluster profile, the user config, the run index, a run record, a secrets file) cannot
hang a command or exhaust memory: a device that never ends (/dev/zero), a FIFO nobody writes, a
folder, a huge sparse file. Each is one line, exit 2 (a damaged run record: a warning, as any
damaged record is), within seconds. Real CLI processes, each under a memory limit, so that a reader
that tries to take it all fails here rather than on the machine."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterkit.spec.bounded_read import InputFileError, read_bounded
from conftest import REPO

MEMORY_LIMIT = 3 << 30
TIMEOUT_S = 30


def _plant(path: Path, kind: str) -> None:
    """Something at ``path`` that is no readable regular file of a sensible size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:  # 64 GiB, no block of it written: only its size says how large it is
        with path.open("wb") as handle:
            handle.truncate(64 << 30)


KINDS = ["dev-zero", "fifo", "directory", "huge"]
PROBLEM = {
    "dev-zero": "not a regular file",
    "fifo": "not a regular file",
    "directory": "not a regular file",
    "huge": "larger than 16 MiB",
}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=TIMEOUT_S,
        preexec_fn=_limited,
        check=False,
    )
    assert time.monotonic() - started < TIMEOUT_S
    return done


def _one_line(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert done.returncode == code and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def _recipe(folder: Path, **fields: object) -> Path:
    path = folder / "r.yaml"
    path.write_text(
        yaml.safe_dump({"name": "r", "resources": {"time": "5"}, "task": {"script": "/bin/true"}, **fields})
    )
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_a_recipe(tmp_path: Path, kind: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    _plant(recipe, kind)
    # A folder given to validate is a folder of recipes: render reads the one recipe it names.
    argv = (
        ["render", str(recipe), "-o", str(tmp_path / "out")]
        if kind == "directory"
        else ["validate", str(recipe), "--json"]
    )
    done = _cli(*argv, cwd=tmp_path)
    if kind == "directory":
        assert _one_line(done) == f"{recipe}: <top level>: not a regular file"
    elif kind == "fifo":  # a recipe may come through a pipe (validate /dev/stdin): one no process writes is empty
        assert done.returncode == 2 and '"message": "a recipe must be a mapping of keys to values"' in done.stdout, (
            done.stdout
        )
    else:
        assert done.returncode == 2 and f'"message": "{PROBLEM[kind]}"' in done.stdout, done.stdout + done.stderr


def test_a_recipe_through_a_pipe_is_read_to_its_end(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", "validate", "/dev/stdin"],
        input=recipe.read_text(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0 and done.stdout == "/dev/stdin: ok\n", done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_recipe_it_extends(tmp_path: Path, kind: str) -> None:
    _plant(tmp_path / "base.yaml", kind)
    recipe = _recipe(tmp_path, extends="base.yaml")
    line = _one_line(_cli("validate", str(recipe), cwd=tmp_path))
    # What is no file is no base recipe.
    assert line == (
        f"{tmp_path / 'base.yaml'}: <top level>: {PROBLEM[kind]}"
        if kind == "huge"
        else f"{recipe}:1: extends: base recipe not found: base.yaml"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_cluster_profile(tmp_path: Path, kind: str) -> None:
    _plant(tmp_path / "clusters" / "site.yaml", kind)
    line = _one_line(_cli("validate", str(_recipe(tmp_path, cluster="site")), cwd=tmp_path))
    # Where a profile is looked up by name, what is no file is no profile.
    expected = (
        f"{tmp_path / 'clusters' / 'site.yaml'}: <top level>: {PROBLEM[kind]}"
        if kind == "huge"
        else "no cluster profile 'site'"
    )
    assert expected in line


@pytest.mark.parametrize("kind", KINDS)
def test_the_user_config(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "config.yaml"
    _plant(config, kind)
    line = _one_line(_cli("ls", cwd=tmp_path, env={"CLUSTERKIT_CONFIG": str(config)}))
    assert line == f"{config}: <top level>: {PROBLEM[kind]}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_run_index(tmp_path: Path, kind: str) -> None:
    index = tmp_path / "state" / "clusterkit" / "runs.jsonl"
    _plant(index, kind)
    line = _one_line(_cli("ls", cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state")}))
    problem = PROBLEM[kind].replace("16 MiB", "64 MiB")
    assert line == f"clusterkit: {index}: {problem} (the run index)"


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_record_is_skipped_with_a_warning(tmp_path: Path, kind: str) -> None:
    record = tmp_path / "runs" / "r" / "1" / "run.json"
    _plant(record, kind)
    done = _cli("ls", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    problem = PROBLEM[kind].replace("16 MiB", "1 MiB")
    assert _one_line(done, code=0) == f"clusterkit: skipping {record}: {problem} (a run record)"


@pytest.mark.parametrize("kind", KINDS)
def test_a_secrets_file(tmp_path: Path, kind: str) -> None:
    secrets_file = tmp_path / "secrets.env"
    _plant(secrets_file, kind)
    if kind == "huge":
        secrets_file.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(f"secrets_file: {secrets_file}\n")
    recipe = _recipe(tmp_path, secrets=["NOT_IN_THE_ENVIRONMENT"], runs_dir=str(tmp_path / "runs"), snapshot=False)
    done = _cli("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"CLUSTERKIT_CONFIG": str(config)})
    assert _one_line(done) == f"clusterkit: {secrets_file}: {PROBLEM[kind]} (the secrets_file)"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("limit", [0, 5, 6, 1 << 20])
def test_read_bounded_reads_to_the_limit_and_no_further(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "five"
    path.write_bytes(b"12345")
    if limit < 5:
        with pytest.raises(InputFileError, match=f"^{path}: larger than {limit} bytes \\(it\\)$"):
            read_bounded(path, limit, "it")
    else:
        assert read_bounded(path, limit, "it") == b"12345"


@pytest.mark.parametrize("source", ["/proc/self/status", "/proc/self/environ"])
def test_a_proc_file_whose_size_says_zero_is_read_whole(source: str) -> None:
    assert os.stat(source).st_size == 0
    assert read_bounded(source, 1 << 20, "it").startswith(Path(source).read_bytes()[:4])


def test_a_missing_file_is_the_oserror_it_always_was(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing", 8, "it")


def test_status_of_a_run_whose_files_are_hostile_answers_at_once(tmp_path: Path) -> None:
    """A run directory's own files (exit code, hostfile, a node's end, its log) read as missing when
    they are no regular files: status answers, from the rest, as for a run that left none."""
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    recipe = _recipe(
        tmp_path,
        runs_dir=str(tmp_path / "runs"),
        task={"script": str(tmp_path / "fail.py")},
        resources={"time": "5", "nodes": 1, "gpus_per_node": 1},
        snapshot=False,
    )
    done = _cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode != 0
    (run_dir,) = (tmp_path / "runs" / "r").iterdir()
    for name, kind in [
        ("exit_code", "fifo"),
        ("hostfile", "dev-zero"),
        ("ranks/node0.exit", "fifo"),
        (f"{run_dir.name}_0_log.err", "dev-zero"),
        ("preempted.json", "directory"),
        ("metrics.jsonl", "fifo"),
    ]:
        (run_dir / name).unlink(missing_ok=True)
        _plant(run_dir / name, kind)
    status = _cli("status", str(run_dir), cwd=tmp_path)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert status.stdout.startswith(f"{run_dir.name}  r  FAILED  (the local batch process ended without an exit code)")
    plotted = _cli("plot", str(run_dir), "-o", str(tmp_path / "c.png"), cwd=tmp_path)
    assert "has no metrics yet" in _one_line(plotted, code=1)  # as before the job logs any

"""The code snapshot: a submit copies the script's git tree (or folder) into <run dir>/code and the job
runs the script from there, so editing the script after submitting changes nothing for a queued job.
Real git repositories, the real CLI, jobs on the local executor (the SLURM one is marked for the dev cluster)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

HOSTILE = "my code ~ % -x"  # the repository's folder: spaces, ~, %, a leading dash in a word
# The script prints which version of itself and of a module beside it ran (the module proves imports come from the copy).
SCRIPT = "import helper\nprint('RAN', 'script-{version}', helper.VERSION, flush=True)\n"
HELPER = "VERSION = 'helper-{version}'\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _write_code(folder: Path, version: str) -> None:
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "train.py").write_text(SCRIPT.format(version=version))
    (folder / "src" / "train.py").chmod(0o755)
    (folder / "src" / "helper.py").write_text(HELPER.format(version=version))


def _repo(tmp_path: Path) -> Path:
    """A git repository with the script committed, then modified and not committed."""
    repo = tmp_path / HOSTILE
    repo.mkdir()
    _git(repo, "init", "-q")
    _write_code(repo, "committed")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    _write_code(repo, "dirty")
    return repo


def _recipe(folder: Path, **fields) -> Path:
    """A one-rank python job running src/train.py (relative to the job's working directory, the submit's)."""
    body = {
        "name": "snap",
        "cluster": "dev",
        "launcher": "python",
        "resources": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 1, "time": "5"},
        "task": {"script": "src/train.py"},
        **fields,
    }
    path = folder / "snap.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _submitted(done: subprocess.CompletedProcess[str]) -> Path:
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.split("run dir: ", 1)[1].split("\n", 1)[0])


def _ran(run_dir: Path, timeout: float = 60) -> str:
    """The RAN line the job printed, once it has exited."""
    deadline = time.monotonic() + timeout
    while not (run_dir / "exit_code").exists():
        assert time.monotonic() < deadline, f"the job in {run_dir} did not end"
        time.sleep(0.1)
    assert (run_dir / "exit_code").read_text().strip() == "0", list(run_dir.glob("*log*"))
    logs = "".join(p.read_text() for p in run_dir.glob("*_log.out"))
    return next(line for line in logs.splitlines() if line.startswith("RAN "))


def test_a_dirty_repository_is_copied_as_it_is_and_the_record_says_so(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    dry = run_cli("submit", str(_recipe(repo)), "--executor", "local", "--dry-run", "--json", cwd=repo)
    assert dry.returncode == 0, dry.stderr
    request = json.loads(dry.stdout)
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert request["snapshot"]["commit"] == head and request["snapshot"]["dirty"] is True
    assert '"{run_dir}/code/src/train.py"' in request["files"]["plan.json"]
    run_dir = _submitted(run_cli("submit", str(_recipe(repo)), "--executor", "local", cwd=repo))
    assert _ran(run_dir) == "RAN script-dirty helper-dirty"
    # The copy holds exactly the files the dry run listed (the untracked recipe too: .gitignore does not exclude
    # it), not the runs directory below the repository, and keeps the script's mode.
    copied = sorted(str(p.relative_to(run_dir / "code")) for p in (run_dir / "code").rglob("*") if not p.is_dir())
    assert copied == sorted(request["snapshot"]["files"]) == ["snap.yaml", "src/helper.py", "src/train.py"]
    assert stat.S_IMODE((run_dir / "code" / "src" / "train.py").stat().st_mode) & 0o111
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["code_commit"], record["code_dirty"], record["code_from"]) == (head, True, str(repo))
    status = run_cli("status", str(run_dir), cwd=repo)
    assert f"code:    code/ in the run dir, git {head[:12]} + uncommitted changes of {repo}" in status.stdout


def test_a_clean_repository_is_recorded_clean(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / ".gitignore").write_text("runs/\nsnap.yaml\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "second")
    run_dir = _submitted(run_cli("submit", str(_recipe(repo)), "--executor", "local", cwd=repo))
    assert _ran(run_dir) == "RAN script-dirty helper-dirty"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["code_dirty"] is False and record["code_commit"] == _git(repo, "rev-parse", "HEAD").strip()
    assert not (run_dir / "code" / "snap.yaml").exists()  # ignored: not code


@pytest.mark.parametrize("no_snapshot", [(), ("--no-snapshot",), ("--set", "snapshot=false")])
def test_editing_after_submit_changes_nothing_for_the_queued_job(tmp_path: Path, no_snapshot: tuple[str, ...]) -> None:
    """The job waits (in its setup, before the script starts) for a file created after the script was
    edited: with the snapshot it runs the submitted version, without it the edited one."""
    repo = _repo(tmp_path)
    go = tmp_path / "go"
    recipe = _recipe(repo, setup=[f"while [ ! -e {go} ]; do sleep 0.05; done"])
    run_dir = _submitted(run_cli("submit", str(recipe), "--executor", "local", *no_snapshot, cwd=repo))
    _write_code(repo, "edited-after-submit")
    go.touch()
    if no_snapshot:
        assert _ran(run_dir) == "RAN script-edited-after-submit helper-edited-after-submit"
        assert not (run_dir / "code").exists() and json.loads((run_dir / "run.json").read_text())["code_from"] is None
    else:
        assert _ran(run_dir) == "RAN script-dirty helper-dirty"


def test_a_script_outside_any_repository_copies_its_folder(tmp_path: Path) -> None:
    """Not in a git tree: the script's folder, whole, less the excludes; links inside it stay links, links out
    of it are left out (never followed) and said; the runs directory below it is never copied."""
    work = tmp_path / HOSTILE
    _write_code(work, "plain")
    src = work / "src"
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"x")
    (src / "notes.tmp").write_text("left out by the recipe")
    (src / "alias.py").symlink_to("helper.py")
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    (src / "outside").symlink_to(secret)
    (src / "runs").mkdir()  # the runs directory, here inside the copied folder
    recipe = _recipe(work, runs_dir="src/runs", snapshot={"exclude": ["*.tmp"]})
    dry = run_cli("submit", str(recipe), "--executor", "local", "--dry-run", cwd=work)
    assert dry.returncode == 0, dry.stderr
    assert f"3 files (0.0 MB) of folder {src}; left out: outside -> {secret} (points outside)" in dry.stderr
    run_dir = _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=work))
    assert _ran(run_dir) == "RAN script-plain helper-plain"
    code = run_dir / "code"
    assert sorted(p.name for p in code.iterdir()) == ["alias.py", "helper.py", "train.py"]
    assert os.readlink(code / "alias.py") == "helper.py"
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["code_from"], record["code_commit"], record["code_dirty"]) == (str(src), None, None)


def test_a_named_folder_is_copied_instead_of_the_repository(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "big.bin").write_bytes(b"0" * 2_000_000)  # in the repository, not in the named folder
    recipe = _recipe(repo, snapshot={"dir": "src", "max_mb": 1})
    run_dir = _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=repo))
    assert _ran(run_dir) == "RAN script-dirty helper-dirty"
    assert sorted(p.name for p in (run_dir / "code").iterdir()) == ["helper.py", "train.py"]


def test_a_huge_folder_is_refused_without_walking_all_of_it(tmp_path: Path) -> None:
    """snapshot.dir: / holds the script, and everything else: the walk stops at the limit."""
    repo = _repo(tmp_path)
    started = time.monotonic()
    done = run_cli("submit", str(_recipe(repo, snapshot={"dir": "/"})), "--executor", "local", "--dry-run", cwd=repo)
    assert done.returncode == 2 and "snapshot: / holds more than 100 MB" in done.stderr, done.stderr
    assert time.monotonic() - started < 60


def test_a_snapshot_over_the_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "data.bin").write_bytes(b"0" * 1_500_000)  # untracked, not ignored: it would be copied
    recipe = _recipe(repo, snapshot={"max_mb": 1})
    for args in (("--dry-run",), ()):
        done = run_cli("submit", str(recipe), "--executor", "local", *args, cwd=repo)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert (
            "snapshot: " in done.stderr and "over snapshot.max_mb 1" in done.stderr and "--no-snapshot" in done.stderr
        )
    assert not (repo / "runs").exists() or not list((repo / "runs").rglob("run.json"))
    assert run_cli("submit", str(recipe), "--executor", "local", "--dry-run", "--no-snapshot", cwd=repo).returncode == 0


def test_a_git_repository_inside_the_runs_directory_is_not_entered(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    nested = repo / "runs" / "old" / "checkout"
    nested.mkdir(parents=True)
    _git(nested, "init", "-q")
    (nested / "huge.bin").write_bytes(b"0" * 2_000_000)
    (repo / "runs" / "old" / "loose.bin").write_bytes(b"0" * 2_000_000)
    dry = run_cli(
        "submit", str(_recipe(repo, snapshot={"max_mb": 1})), "--executor", "local", "--dry-run", "--json", cwd=repo
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["snapshot"]["files"] == ["snap.yaml", "src/helper.py", "src/train.py"]


def test_runs_directly_in_the_repository_are_not_copied_by_the_next_submit(tmp_path: Path) -> None:
    """runs_dir: . puts run directories at <repo>/<name>/<job id>: the run's name folder is left out."""
    repo = _repo(tmp_path)
    recipe = _recipe(repo, runs_dir=".")
    first = _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=repo))
    assert _ran(first) == "RAN script-dirty helper-dirty" and first.parent == repo / "snap"
    second = _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=repo))
    assert _ran(second) == "RAN script-dirty helper-dirty"
    assert sorted(str(p.relative_to(second / "code")) for p in (second / "code").rglob("*") if not p.is_dir()) == [
        "snap.yaml",
        "src/helper.py",
        "src/train.py",
    ]


def test_a_submodule_is_left_out_and_said(tmp_path: Path) -> None:
    """git archive leaves a submodule's files out; so does the snapshot, and it says so."""
    library = tmp_path / "library"
    library.mkdir()
    _git(library, "init", "-q")
    (library / "lib.py").write_text("X = 1\n")
    _git(library, "add", "-A")
    _git(library, "commit", "-qm", "lib")
    repo = _repo(tmp_path)
    _git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/lib")
    dry = run_cli("submit", str(_recipe(repo)), "--executor", "local", "--dry-run", "--json", cwd=repo)
    snapshot = json.loads(dry.stdout)["snapshot"]
    assert "vendor/lib/ (a submodule or nested git repository)" in snapshot["left_out"]
    assert not any(name.startswith("vendor/lib/") for name in snapshot["files"]) and ".gitmodules" in snapshot["files"]


def test_lfs_files_are_copied_as_they_are_checked_out(tmp_path: Path) -> None:
    """The snapshot copies the work tree's bytes: an LFS file whose content was not fetched (here: no
    git-lfs at all) stays the pointer it is on disk; a fetched one would be its content."""
    repo = _repo(tmp_path)
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 123456789\n"
    (repo / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (repo / "weights.bin").write_text(pointer)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "lfs")
    run_dir = _submitted(run_cli("submit", str(_recipe(repo)), "--executor", "local", cwd=repo))
    assert _ran(run_dir) == "RAN script-dirty helper-dirty"
    assert (run_dir / "code" / "weights.bin").read_text() == pointer


@pytest.mark.parametrize(
    "task, message",
    [
        (
            {
                "trainer": {
                    "model": {"config": {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32}},
                    "dataset": {"type": "synthetic", "seq_len": 8, "num_samples": 8},
                }
            },
            "the built-in trainer's code",
        ),
        ({"script": "src.train", "module": True}, "a module task"),
        ({"script": "/shared/not/here.py"}, "task.script /shared/not/here.py is not a file on this machine"),
    ],
)
def test_snapshot_true_where_there_is_nothing_to_copy_is_an_error(tmp_path: Path, task: dict, message: str) -> None:
    repo = _repo(tmp_path)
    recipe = _recipe(repo, task=task, snapshot=True)
    done = run_cli("validate", str(recipe), cwd=repo)
    assert done.returncode == 2 and "snap.yaml:" in done.stderr and f"snapshot: {message}" in done.stderr, done.stderr
    default = _recipe(repo, task=task)  # without snapshot: no snapshot, no error
    dry = run_cli("submit", str(default), "--executor", "slurm", "--dry-run", "--json", cwd=repo)
    assert dry.returncode == 0 and json.loads(dry.stdout)["snapshot"] is None, dry.stderr


def test_concurrent_submits_each_get_their_own_copy(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    recipe = _recipe(repo)
    with ThreadPoolExecutor(6) as pool:
        runs = list(
            pool.map(lambda _: _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=repo)), range(6))
        )
    assert len(set(runs)) == 6
    assert all(_ran(run_dir) == "RAN script-dirty helper-dirty" for run_dir in runs)
    assert not list((repo / "runs").rglob(".staging-*")) and not (repo / ".git" / "index.lock").exists()


@pytest.mark.slurm
def test_a_queued_job_runs_the_version_that_was_submitted(dev_cluster: str, tmp_path: Path) -> None:
    """The issue's case on SLURM: the job waits in the queue (--after a sleeping job) while the script is
    edited, then starts (the sleeper cancelled, --after-type afterany); it runs the submitted version.
    With --no-snapshot it runs the edited one."""
    outputs = {}
    for flags in ((), ("--no-snapshot",)):
        folder = tmp_path / f"case{len(outputs)}"
        folder.mkdir()
        repo = _repo(folder)
        sleeper = (
            subprocess.run(
                ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300"],
                cwd=folder,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .split(";")[0]
        )
        done = run_cli("submit", str(_recipe(repo)), "--after", sleeper, "--after-type", "afterany", *flags, cwd=repo)
        run_dir = _submitted(done)
        state = subprocess.run(["squeue", "-h", "-j", run_dir.name, "-o", "%T"], capture_output=True, text=True).stdout
        assert state.strip() == "PENDING", state
        _write_code(repo, "edited-while-queued")
        subprocess.run(["scancel", sleeper], check=True)
        outputs[flags] = _ran(run_dir, timeout=120)
    assert outputs[()] == "RAN script-dirty helper-dirty"
    assert outputs[("--no-snapshot",)] == "RAN script-edited-while-queued helper-edited-while-queued"


@pytest.mark.parametrize(
    "snapshot, message",
    [
        ({"dir": "no such\nfolder"}, "snapshot.dir: not a folder: "),
        ({"dir": "src/train.py"}, "snapshot.dir: not a folder: "),
        ({"dir": "other"}, "snapshot.dir: task.script src/train.py is not inside "),
        ({"max_mb": 0}, "snapshot.max_mb"),
        ({"colour": "red"}, "snapshot"),
    ],
)
def test_bad_snapshot_settings_are_one_line(tmp_path: Path, snapshot: dict, message: str) -> None:
    repo = _repo(tmp_path)
    (repo / "other").mkdir()
    done = run_cli("validate", str(_recipe(repo, snapshot=snapshot)), cwd=repo)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_the_users_secrets_file_is_never_copied_with_the_code(tmp_path: Path) -> None:
    """A secrets_file kept untracked beside the code (not in .gitignore) would otherwise be copied into
    the run directory, outliving the job; it is left out of every snapshot, whether the recipe has secrets or not."""
    repo = _repo(tmp_path)
    secrets_file = repo / "secrets.env"
    secrets_file.write_text("HF_TOKEN=hunter2\n")
    secrets_file.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text(f"secrets_file: {secrets_file}\n")
    env = {**os.environ, "CLUSTERKIT_CONFIG": str(config)}
    env.pop("HF_TOKEN", None)
    for fields in ({"secrets": ["HF_TOKEN"]}, {}):
        done = run_cli(
            "submit", str(_recipe(repo, **fields)), "--executor", "local", "--dry-run", "--json", cwd=repo, env=env
        )
        assert done.returncode == 0, done.stderr
        assert "secrets.env" not in json.loads(done.stdout)["snapshot"]["files"]


def _earlier_run(run_dir: Path, name: str = "old", **record: object) -> None:
    """A run directory as clusterkit leaves one: its record, secrets, logs and code copy."""
    (run_dir / "code" / "src").mkdir(parents=True)
    (run_dir / "code" / "src" / "train.py").write_text("old copy\n")
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "job_id": run_dir.name,
                "name": name,
                "scheduler": "slurm",
                "run_dir": str(run_dir),
                "recipe": "r.yaml",
                "submitted_at": 1.0,
                "nodes": 1,
                "ranks_per_node": 1,
                "launcher": "python",
                **record,
            }
        )
    )
    (run_dir / ".secrets.env").write_bytes(b"HF_TOKEN=old-run-MARK\0")
    (run_dir / ".secrets.env").chmod(0o600)
    (run_dir / f"{run_dir.name}_0_log.out").write_text("log\n")


@pytest.mark.parametrize("how", ["git", "folder"])
def test_earlier_run_directories_and_secrets_are_never_code(tmp_path: Path, how: str) -> None:
    """Run directories of another runs_dir or a sweep's, a render folder and any .secrets.env inside the
    copied tree are left out at any depth (and said), in a git tree (untracked or committed) and in a
    plain folder; a code file that merely happens to be called run.json stays."""
    if how == "git":
        repo = _repo(tmp_path)
        root = repo
    else:
        root = tmp_path / HOSTILE
        _write_code(root, "plain")
        repo = root
    _earlier_run(root / "experiments" / "runs-a" / "snap" / "1234")
    array = root / "sweeps" / "runs" / "grid" / "77"  # a sweep's array: its secrets at the top, a record per task
    _earlier_run(array, tasks=[0, 1])
    _earlier_run(array / "0", name="grid")
    (root / "rendered").mkdir()
    (root / "rendered" / ".clusterkit-render").write_text('{"files": ["job.sbatch"]}\n')
    (root / "rendered" / "job.sbatch").write_text("#!/bin/bash\n")
    (root / "src" / "conf").mkdir()
    (root / "src" / "conf" / "run.json").write_text('{"learning_rate": 0.1}\n')  # the user's, not a run record
    (root / "src" / "conf" / ".secrets.env").write_text("HF_TOKEN=stray-MARK\n")
    if how == "git":
        _git(repo, "add", "-A", "experiments")  # committed by mistake: still no code
        _git(repo, "commit", "-qm", "an old run")
    recipe = _recipe(repo, **({} if how == "git" else {"snapshot": {"dir": "."}}))
    dry = run_cli("submit", str(recipe), "--executor", "local", "--dry-run", "--json", cwd=repo)
    assert dry.returncode == 0, dry.stderr
    snapshot = json.loads(dry.stdout)["snapshot"]
    assert sorted(snapshot["files"]) == ["snap.yaml", "src/conf/run.json", "src/helper.py", "src/train.py"]
    assert {
        "experiments/runs-a/snap/1234/ (a clusterkit run directory)",
        "sweeps/runs/grid/77/ (a clusterkit run directory)",
        "rendered/ (a clusterkit render)",
    } <= set(snapshot["left_out"])
    run_dir = _submitted(run_cli("submit", str(recipe), "--executor", "local", cwd=repo))
    _ran(run_dir)
    copied = sorted(str(p.relative_to(run_dir / "code")) for p in (run_dir / "code").rglob("*") if not p.is_dir())
    assert copied == sorted(snapshot["files"])
    for path in [run_dir, *run_dir.rglob("*")]:
        assert (
            not path.is_file()
            or b"-MARK" not in path.read_bytes()  # old-run-MARK, stray-MARK
            or path.name == ".secrets.env"
            and path.parent == run_dir
        )

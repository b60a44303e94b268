"""A recipe's secrets: named in the recipe, valued at submit, seen by every rank and written nowhere
else: every file of the run directory, the command's output, --dry-run and --json are searched for
the value (bytes) and must not hold it. Local executor here; tests/test_secrets_slurm.py runs the
same search on SLURM and over SSH."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import test_ssh_transports
from conftest import REPO, interruptible

CHECK_SECRET = REPO / "tests" / "scripts" / "check_secret.py"
# Hostile bytes: a line break, quotes, command substitutions, a NUL-free non-UTF-8 byte, a trailing backslash.
HOSTILE = b"s3cr3t-MARK-q\n'\"$(touch /tmp/pwned)`id`${HOME}\xff\xfe;rm -rf x \\"


def secret_recipe(directory: Path, name: str = "HF_TOKEN", value: bytes = HOSTILE, **extra: object) -> Path:
    # The script in a folder of its own: its code snapshot (on by default) is that folder, not this
    # repository, whose tests spell the marker values out (a copy of them would read as a leak).
    script = directory / "job-code" / CHECK_SECRET.name
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(CHECK_SECRET, script)
    recipe = {
        "name": "sec",
        "cluster": "dev",
        "launcher": "python",
        "runs_dir": str(directory / "runs"),
        "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1},
        "preemption": {"max_requeues": 0},
        "secrets": [name],
        "task": {"script": str(script), "args": [name, hashlib.sha256(value).hexdigest()]},
        **extra,
    }
    path = directory / "sec.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def clusterkit(
    *args: str, cwd: Path, env: dict[str, str | bytes] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[bytes]:
    """The real CLI with ``env`` added to (or, as None values, removed from) this environment; output as bytes."""
    full: dict[str | bytes, str | bytes] = {key: value for key, value in os.environ.items() if key not in (env or {})}
    full.update({key: value for key, value in (env or {}).items() if value is not None})
    return subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", *args], cwd=cwd, env=full, capture_output=True, timeout=timeout
    )


def leaks(value: bytes, *places: Path | bytes) -> list[str]:
    """Where ``value`` (or its distinctive 'MARK' word, in case it was escaped) appears: every file
    under each directory (recursively, hidden ones and leftovers included) and each output."""
    words = {value, *[word for word in value.split() if b"MARK" in word]}
    found = []
    for place in places:
        if isinstance(place, bytes):
            found += [f"output: {word!r}" for word in words if word in place]
            continue
        for path in [place, *place.rglob("*")]:
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [f"{path}: {word!r}" for word in words if word in data]
    return found


def error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one line of an error (the recipe's warnings aside)."""
    (line,) = [line for line in done.stderr.decode().splitlines() if ": warning: " not in line]
    return line


def wait_done(runs: Path, cwd: Path, timeout: float = 120) -> Path:
    (run_dir,) = [path for path in (runs / "sec").iterdir() if path.name.isdigit()]
    deadline = time.monotonic() + timeout
    while not (run_dir / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # the batch script's EXIT trap runs after exit_code is written
    return run_dir


def test_the_ranks_see_the_exact_value_and_no_file_or_output_holds_it(tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path)
    env = {"HF_TOKEN": HOSTILE}
    dry = clusterkit("submit", str(recipe), "--executor", "local", "--dry-run", cwd=tmp_path, env=env)
    dry_json = clusterkit("submit", str(recipe), "--executor", "local", "--dry-run", "--json", cwd=tmp_path, env=env)
    rendered = clusterkit("render", str(recipe), "-o", str(tmp_path / "rendered"), cwd=tmp_path, env=env)
    assert dry.returncode == dry_json.returncode == rendered.returncode == 0, dry.stderr + dry_json.stderr
    assert b"HF_TOKEN" in dry.stdout  # named, in the comment over the lines that read the file
    done = clusterkit("submit", str(recipe), "--executor", "local", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    run_dir = wait_done(tmp_path / "runs", tmp_path)
    assert (run_dir / "exit_code").read_text().strip() == "0", run_dir / "sec_0_log.err"
    assert sorted((run_dir / "secret-check").iterdir()) and all(
        path.read_text() == "ok" for path in (run_dir / "secret-check").iterdir()
    )
    assert len(list((run_dir / "secret-check").iterdir())) == 2  # both ranks
    status = clusterkit("status", "--json", str(run_dir), cwd=tmp_path)
    logs = clusterkit("logs", str(run_dir), cwd=tmp_path)
    assert (
        leaks(
            HOSTILE,
            tmp_path,
            dry.stdout + dry.stderr,
            dry_json.stdout + dry_json.stderr,
            done.stdout + done.stderr,
            status.stdout + status.stderr,
            logs.stdout + logs.stderr,
            Path(os.environ["XDG_STATE_HOME"]),
        )
        == []
    )
    assert not Path("/tmp/pwned").exists()
    # Its run was a job no requeue restarts: the file went with its end.
    assert not (run_dir / ".secrets.env").exists()


def test_a_local_job_with_requeues_still_removes_the_file_at_its_end(tmp_path: Path) -> None:
    # The local executor never requeues, so the end of its job is the end of the run.
    recipe = secret_recipe(tmp_path, value=b"requeues-MARK", preemption={"max_requeues": 3})
    done = clusterkit(
        "submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path, env={"HF_TOKEN": "requeues-MARK"}
    )
    assert done.returncode == 0, done.stderr
    run_dir = wait_done(tmp_path / "runs", tmp_path)
    assert {path.read_text() for path in (run_dir / "secret-check").iterdir()} == {"ok"}
    assert not (run_dir / ".secrets.env").exists()


# What the launch step does, as the fake srun below plays it on "SLURM" (no CLUSTERKIT_EXECUTOR):
# completed, failed, requeued by the program (it writes the marker, then the job is stopped), the batch
# shell's supervisor killed (SLURM's own requeue), failed with a retry queued.
_FAKE_SRUN = """#!/bin/bash
case "$OUTCOME" in
  completed) exit 0 ;;
  requeued) echo '{"step": 5, "restart": 1}' > "$RUN_DIR/requeued"; exit 0 ;;
  killed) kill -TERM "$PPID"; sleep 5; exit 0 ;;
  *) exit 1 ;;
esac
"""
_FAKE_SLURM = {
    "srun": _FAKE_SRUN,
    "scontrol": '#!/bin/sh\n[ "$1" = show ] && echo localhost; exit 0\n',
    "sbatch": "#!/bin/sh\necho 4243\n",
}


@pytest.mark.parametrize(
    "outcome, retries, kept",
    [
        ("completed", 0, False),
        ("failed", 0, False),
        ("stale-requeued", 0, False),
        ("preflight-failed", 0, False),
        ("requeued", 0, True),
        ("killed", 0, True),
        ("failed", 1, True),
    ],
)
def test_on_slurm_with_requeues_the_file_goes_when_the_run_ends_for_good(
    tmp_path: Path, outcome: str, retries: int, kept: bool
) -> None:
    """preemption.max_requeues > 0 on SLURM: the batch script keeps the file while the job may start
    again (requeued by the runner, killed by SLURM for its own requeue, a retry queued) and removes it
    once the launch step ended the run (completed, failed with nothing to start it again, a failed
    preflight). The rendered script itself, in bash, with srun, scontrol and sbatch played by stand-ins."""
    from clusterkit import load_recipe, render_job

    preflight = {"preflight": {"enabled": True}} if outcome == "preflight-failed" else {}
    recipe = secret_recipe(tmp_path, preemption={"max_requeues": 2, "max_retries": retries}, **preflight)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in _FAKE_SLURM.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "runs" / "sec" / "4242"
    run_dir.mkdir(parents=True)
    for name, text in render_job(load_recipe(recipe)).files.items():  # as submit writes them
        (run_dir / name).parent.mkdir(exist_ok=True)
        (run_dir / name).write_text(text)
    secrets = run_dir / ".secrets.env"
    secrets.write_bytes(b"HF_TOKEN=requeue-MARK\0")
    secrets.chmod(0o600)
    if outcome == "stale-requeued":  # an earlier attempt's marker: this start is not requeued
        (run_dir / "requeued").write_text("{}\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SLURM_", "CLUSTERKIT_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="localhost",
        SLURM_SUBMIT_DIR=str(tmp_path),
        OUTCOME=outcome,
    )
    done = subprocess.run(
        ["bash", str(run_dir / "job.sbatch")], cwd=tmp_path, env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0 or outcome in ("completed", "stale-requeued", "requeued"), done.stderr
    assert b"launchers exited" in done.stdout or outcome in ("killed", "preflight-failed"), done.stdout + done.stderr
    assert secrets.exists() == kept, (done.stdout + done.stderr).decode()
    assert (run_dir / "requeued").exists() == (outcome == "requeued")


def test_a_value_from_the_secrets_file_reaches_the_ranks(tmp_path: Path) -> None:
    value = b"from-file-MARK ' \" $(id) \\"
    secrets_file = tmp_path / "secrets"
    secrets_file.write_bytes(b"# tokens\n\nWANDB_API_KEY=" + value + b"\n")
    secrets_file.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text("secrets_file: secrets\n")
    recipe = secret_recipe(tmp_path, "WANDB_API_KEY", value)
    done = clusterkit(
        "submit",
        str(recipe),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"CLUSTERKIT_CONFIG": str(config), "WANDB_API_KEY": None},
    )
    assert done.returncode == 0, done.stderr
    run_dir = wait_done(tmp_path / "runs", tmp_path)
    assert {path.read_text() for path in (run_dir / "secret-check").iterdir()} == {"ok"}
    assert leaks(value, tmp_path / "runs", done.stdout + done.stderr) == []


def test_the_environment_wins_over_the_secrets_file(tmp_path: Path) -> None:
    secrets_file = tmp_path / "secrets"
    secrets_file.write_bytes(b"HF_TOKEN=stale\n")
    secrets_file.chmod(0o600)
    (tmp_path / "config.yaml").write_text(f"secrets_file: {secrets_file}\n")
    recipe = secret_recipe(tmp_path, "HF_TOKEN", b"fresh")
    done = clusterkit(
        "submit",
        str(recipe),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"CLUSTERKIT_CONFIG": str(tmp_path / "config.yaml"), "HF_TOKEN": "fresh"},
    )
    assert done.returncode == 0, done.stderr
    assert {path.read_text() for path in (wait_done(tmp_path / "runs", tmp_path) / "secret-check").iterdir()} == {"ok"}


def _nothing_queued(tmp_path: Path) -> None:
    sec = tmp_path / "runs" / "sec"
    assert not sec.exists() or list(sec.iterdir()) == [], list(sec.iterdir())


def test_a_missing_secret_is_one_line_naming_it_and_nothing_is_written(tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path)
    done = clusterkit("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"HF_TOKEN": None})
    assert done.returncode == 2
    assert error_line(done).startswith("clusterkit: secret HF_TOKEN is not set: export it"), done.stderr
    _nothing_queued(tmp_path)
    empty = clusterkit("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"HF_TOKEN": ""})
    assert empty.returncode == 2 and b"secret HF_TOKEN is empty in the environment" in empty.stderr
    _nothing_queued(tmp_path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_secrets_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    secrets_file = tmp_path / "secrets"
    secrets_file.write_text("HF_TOKEN=leaky-MARK\n")
    secrets_file.chmod(mode)
    (tmp_path / "config.yaml").write_text("secrets_file: secrets\n")
    done = clusterkit(
        "submit",
        str(secret_recipe(tmp_path)),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"CLUSTERKIT_CONFIG": str(tmp_path / "config.yaml"), "HF_TOKEN": None},
    )
    assert done.returncode == 2
    assert error_line(done) == (
        f"clusterkit: {secrets_file}: secrets_file must be yours and readable by you only "
        f"(mode {mode:o}); chmod 600 {secrets_file}"
    ), done.stderr
    assert b"leaky" not in done.stderr
    _nothing_queued(tmp_path)


def test_a_bad_secrets_file_line_is_file_and_line_without_the_value(tmp_path: Path) -> None:
    secrets_file = tmp_path / "secrets"
    secrets_file.write_text("OTHER=fine\nexport HF_TOKEN=oops-MARK\n")
    secrets_file.chmod(0o600)
    (tmp_path / "config.yaml").write_text("secrets_file: secrets\n")
    done = clusterkit(
        "submit",
        str(secret_recipe(tmp_path)),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"CLUSTERKIT_CONFIG": str(tmp_path / "config.yaml"), "HF_TOKEN": None},
    )
    assert done.returncode == 2
    assert error_line(done).startswith(f"clusterkit: {secrets_file}:2: not a NAME=value line"), done.stderr
    assert b"oops" not in done.stderr
    _nothing_queued(tmp_path)


def test_a_value_too_long_for_an_environment_string_is_refused(tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path)
    secrets_file = tmp_path / "secrets"
    secrets_file.write_bytes(b"HF_TOKEN=" + b"x" * (128 * 1024) + b"\n")
    secrets_file.chmod(0o600)
    (tmp_path / "config.yaml").write_text("secrets_file: secrets\n")
    done = clusterkit(
        "submit",
        str(recipe),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"CLUSTERKIT_CONFIG": str(tmp_path / "config.yaml"), "HF_TOKEN": None},
    )
    assert done.returncode == 2 and b"secret HF_TOKEN in " in done.stderr and b"is longer than" in done.stderr


def test_a_long_value_passes_exactly(tmp_path: Path) -> None:
    value = b"long-MARK" + bytes(range(1, 256)) * 300  # ~76 KB, every byte but NUL
    done = clusterkit(
        "submit",
        str(secret_recipe(tmp_path, value=value)),
        "--executor",
        "local",
        cwd=tmp_path,
        env={"HF_TOKEN": value},
    )
    assert done.returncode == 0, done.stderr
    assert {path.read_text() for path in (wait_done(tmp_path / "runs", tmp_path) / "secret-check").iterdir()} == {"ok"}


@pytest.mark.parametrize(
    "names, message",
    [
        ('["HF-TOKEN"]', "secrets[0]: must be letters, digits and '_' only"),
        ('["1TOKEN"]', "secrets[0]: must be letters, digits and '_' only"),
        ('["A\\nB"]', "secrets[0]: must be letters, digits and '_' only"),
        ("[SLURM_JOB_ID]", "secrets[0]: SLURM_JOB_ID is set by SLURM"),
        ("[MASTER_ADDR]", "secrets[0]: MASTER_ADDR is set by the job script"),
        ("[HF_TOKEN, HF_TOKEN]", "secrets[1]: HF_TOKEN is named twice"),
        ("HF_TOKEN", "secrets: Expected `array`, got `str`"),
    ],
)
def test_a_bad_secret_name_is_one_line_with_file_and_line(tmp_path: Path, names: str, message: str) -> None:
    recipe = secret_recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace("secrets:\n- HF_TOKEN\n", f"secrets: {names}\n"))
    done = clusterkit("validate", str(recipe), cwd=tmp_path)
    assert done.returncode == 2
    line = error_line(done)
    assert line.startswith(f"{recipe}:") and message in line, line


def test_a_token_like_name_in_env_is_warned_about(tmp_path: Path) -> None:
    recipe = secret_recipe(
        tmp_path,
        env={
            "HF_TOKEN": "plain",
            "MY_API_KEY": "k",
            "DB_PASSWORD_FILE": "/x",
            "S3_SECRET": "s",
            "TOKENIZERS_PARALLELISM": "false",
        },
    )
    done = clusterkit("validate", str(recipe), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warned = sorted(
        line.split("env.")[1].split(":")[0] for line in done.stderr.decode().splitlines() if "plain text" in line
    )
    assert warned == ["DB_PASSWORD_FILE", "HF_TOKEN", "MY_API_KEY", "S3_SECRET"]


def test_private_files_are_0600_from_the_start_and_never_written_through(tmp_path: Path) -> None:
    from clusterkit.schedulers.secret_values import write_private

    old = os.umask(0)
    try:
        write_private(str(tmp_path / "a"), b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_private(str(tmp_path / "a"), b"y")
    (tmp_path / "target").write_text("t")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError):
        write_private(str(tmp_path / "link"), b"y")
    assert (tmp_path / "target").read_text() == "t" and (tmp_path / "a").read_bytes() == b"x"


def test_kill_9_between_the_secrets_file_and_sbatch_leaves_it_0600(tmp_path: Path) -> None:
    # A stand-in sbatch that hangs: the submitter is killed while the staging directory holds the file.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\ntouch "$STARTED"\nsleep 60\n')
    (bin_dir / "sbatch").chmod(0o755)
    recipe = secret_recipe(tmp_path)
    env = {"HF_TOKEN": HOSTILE, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STARTED": str(tmp_path / "started")}
    full = {**os.environ, **env}
    process = subprocess.Popen(
        [sys.executable, "-m", "clusterkit.cli.main", "submit", str(recipe), "--executor", "slurm"],
        cwd=tmp_path,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (left,) = (tmp_path / "runs" / "sec").glob(".staging-*/.secrets.env")
    assert stat.S_IMODE(left.stat().st_mode) == 0o600 and left.stat().st_uid == os.getuid()


def test_ctrl_c_while_sbatch_runs_removes_the_secrets(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\ntouch "$STARTED"\nsleep 60\n')
    (bin_dir / "sbatch").chmod(0o755)
    full = {
        **os.environ,
        "HF_TOKEN": "ctrl-c-MARK",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STARTED": str(tmp_path / "started"),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "clusterkit.cli.main", "submit", str(secret_recipe(tmp_path)), "--executor", "slurm"],
        cwd=tmp_path,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) != 0
    assert leaks(b"ctrl-c-MARK", tmp_path / "runs") == []


def test_concurrent_submits_each_get_their_own_value(tmp_path: Path) -> None:
    def submit(index: int) -> tuple[Path, bytes]:
        directory = tmp_path / str(index)
        directory.mkdir()
        value = f"concurrent-MARK-{index}".encode()
        done = clusterkit(
            "submit",
            str(secret_recipe(directory, value=value)),
            "--executor",
            "local",
            cwd=directory,
            env={"HF_TOKEN": value},
        )
        assert done.returncode == 0, done.stderr
        return directory, value

    with ThreadPoolExecutor(4) as pool:
        submitted = list(pool.map(submit, range(4)))
    for directory, value in submitted:
        run_dir = wait_done(directory / "runs", directory)
        assert {path.read_text() for path in (run_dir / "secret-check").iterdir()} == {"ok"}
        assert leaks(value, directory / "runs") == []


def test_every_task_of_a_job_array_reads_the_array_s_file(tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path, value=b"array-MARK")
    data = yaml.safe_load(recipe.read_text())
    data["resources"].update(array="0-2%2", gpus_per_node=1)
    recipe.write_text(yaml.safe_dump(data))
    done = clusterkit(
        "submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path, env={"HF_TOKEN": "array-MARK"}
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = [path for path in (tmp_path / "runs" / "sec").iterdir() if path.name.isdigit()]
    assert [(run_dir / str(index) / "secret-check" / "rank-0").read_text() for index in range(3)] == ["ok"] * 3
    # An array's tasks may run again (or later): the file stays, its owner's only.
    assert stat.S_IMODE((run_dir / ".secrets.env").stat().st_mode) == 0o600
    assert (
        leaks(
            b"array-MARK",
            *[path for path in run_dir.rglob("*") if path.name != ".secrets.env" and path.is_file()],
            done.stdout + done.stderr,
        )
        == []
    )


def test_cancel_removes_the_secrets_file(tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path, value=b"cancel-MARK", preemption={"max_requeues": 3})
    data = yaml.safe_load(recipe.read_text())
    sleeper = shutil.copy2(REPO / "tests" / "scripts" / "timed_sleep.py", tmp_path / "job-code")  # beside the other
    data["task"] = {"script": str(sleeper), "args": ["60"]}
    recipe.write_text(yaml.safe_dump(data))
    done = clusterkit("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"HF_TOKEN": "cancel-MARK"})
    assert done.returncode == 0, done.stderr
    (run_dir,) = [path for path in (tmp_path / "runs" / "sec").iterdir() if path.name.isdigit()]
    assert stat.S_IMODE((run_dir / ".secrets.env").stat().st_mode) == 0o600  # while the job runs
    cancelled = clusterkit("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and b"cancelled job" in cancelled.stdout, cancelled.stderr
    assert not (run_dir / ".secrets.env").exists()
    assert leaks(b"cancel-MARK", tmp_path / "runs") == []


ssh_client = test_ssh_transports.client  # a real sshd (no SLURM) and a client HOME, for this module too


@pytest.mark.parametrize("transport", test_ssh_transports.TRANSPORTS)
def test_over_ssh_the_file_is_0600_exclusive_and_the_value_only_on_stdin(
    ssh_client: test_ssh_transports.Client, transport: str
) -> None:
    profile = ssh_client.profile(f"private-{transport}", transport=transport, identity_file="~/.ssh/id_ed25519")
    target = f"runs/-x dir/{'.secrets.env'}"
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "scripts" / "ssh_write_private.py"), str(profile), target],
        input=HOSTILE,
        cwd=ssh_client.root,
        env=ssh_client.env(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == b"SSHError\n", done.stderr  # the second write was refused
    written = ssh_client.root / f"work-private-{transport}" / target
    assert written.read_bytes() == HOSTILE and stat.S_IMODE(written.stat().st_mode) == 0o600
    # The login node's sshd logs each command it runs (LogLevel of the test server): none holds the value.
    assert leaks(HOSTILE, ssh_client.login.log, done.stdout + done.stderr) == []


def test_a_webhook_gets_the_jobs_events_and_its_url_is_in_no_file_or_output(tmp_path: Path) -> None:
    from test_notify import Hook

    hook = Hook()
    url = hook.url.replace("MARK-query", "MARK-webhook")
    try:
        # Named only in notify: it joins secrets: (the ranks' check sees it, as any secret's).
        recipe = secret_recipe(
            tmp_path,
            "SLACK_WEBHOOK",
            url.encode(),
            secrets=[],
            notify={"webhook_secret": "SLACK_WEBHOOK", "events": ["start", "completion"]},
        )
        missing = clusterkit("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"SLACK_WEBHOOK": None})
        assert missing.returncode == 2 and not (tmp_path / "runs" / "sec").exists()
        assert "secret SLACK_WEBHOOK is not set" in error_line(missing)
        done = clusterkit("submit", str(recipe), "--executor", "local", cwd=tmp_path, env={"SLACK_WEBHOOK": url})
        assert done.returncode == 0, done.stderr
        run_dir = wait_done(tmp_path / "runs", tmp_path)
        assert (run_dir / "exit_code").read_text() == "0\n"
        deadline = time.monotonic() + 10
        while len(hook.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [body["event"] for _, _, body in hook.received] == ["start", "completion"]
        assert hook.received[0][0].endswith("?key=MARK-webhook")
        logs = clusterkit("logs", str(run_dir), cwd=tmp_path)
        assert leaks(b"MARK-webhook", tmp_path, done.stdout + done.stderr, logs.stdout + logs.stderr) == []
    finally:
        hook.server.shutdown()

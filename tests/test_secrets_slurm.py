"""A recipe's secrets on real SLURM and over SSH (a real sshd in front of the dev cluster): every rank
sees the exact value, and no file of the run directory (logs, ranks/, leftovers), of the laptop's
records, of the login node's workdir, no output of submit, --dry-run, --json, status or logs holds it;
nor does SLURM's own copy of the job (its state directory), since sbatch never had it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import test_remote
from test_remote import Remote, _job_id
from test_secrets import HOSTILE, clusterkit, leaks, secret_recipe

pytestmark = pytest.mark.slurm
remote = test_remote.remote  # the login node (a real sshd) in front of the dev cluster, for this module too


def _slurm_state_dir() -> Path | None:
    said = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = [line.split("=", 1)[1].strip() for line in said.splitlines() if line.startswith("StateSaveLocation")]
    return Path(found[0]) if found and os.access(found[0], os.R_OK) else None


def test_slurm_ranks_see_the_value_and_nothing_else_holds_it(dev_cluster: str, tmp_path: Path) -> None:
    recipe = secret_recipe(tmp_path, resources={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1})
    env = {"HF_TOKEN": HOSTILE}
    dry = clusterkit("submit", str(recipe), "--executor", "slurm", "--dry-run", cwd=tmp_path, env=env)
    dry_json = clusterkit("submit", str(recipe), "--executor", "slurm", "--dry-run", "--json", cwd=tmp_path, env=env)
    assert dry.returncode == 0 and b"# would run: env -u HF_TOKEN sbatch --parsable --hold" in dry.stderr, dry.stderr
    done = clusterkit("submit", str(recipe), "--executor", "slurm", "--json", "--follow", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    state = _slurm_state_dir()
    (run_dir,) = [path for path in (tmp_path / "runs" / "sec").iterdir() if path.name.isdigit()]
    checks = sorted((run_dir / "secret-check").iterdir())
    assert len(checks) == 4 and {path.read_text() for path in checks} == {"ok"}
    logs = clusterkit("logs", str(run_dir), cwd=tmp_path)
    status = clusterkit("status", "--json", str(run_dir), cwd=tmp_path)
    assert (
        leaks(
            HOSTILE,
            tmp_path,
            dry.stdout + dry.stderr,
            dry_json.stdout + dry_json.stderr,
            done.stdout + done.stderr,
            logs.stdout + logs.stderr,
            status.stdout + status.stderr,
            *([state] if state else []),
        )
        == []
    )
    assert not (run_dir / ".secrets.env").exists()  # max_requeues 0: the job's end was the run's


def test_ssh_ranks_see_the_value_and_nothing_else_holds_it(remote: Remote) -> None:
    value = os.fsdecode(HOSTILE)  # passed as the exact bytes (surrogateescape)
    recipe = secret_recipe(remote.root, resources={"nodes": 2, "gpus_per_node": 1, "cpus_per_task": 1})
    profile = remote.profile("prod-secrets", "remote-secrets")
    env = {**remote.env(), "HF_TOKEN": value}
    args = ("submit", str(recipe), "--cluster", str(profile), "--executor", "ssh", "--set", "runs_dir=runs")
    dry = remote.cli(*args, "--dry-run", env=env)
    dry_json = remote.cli(*args, "--dry-run", "--json", env=env)
    assert dry.returncode == 0 and "env -u HF_TOKEN sbatch" in dry.stderr, dry.stderr
    done = remote.cli(*args, "--follow", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = _job_id(done.stdout)
    run_dir = remote.root / "remote-secrets" / "runs" / "sec" / job_id
    assert {path.read_text() for path in (run_dir / "secret-check").iterdir()} == {"ok"}
    assert len(list((run_dir / "secret-check").iterdir())) == 2
    logs = remote.cli("logs", job_id)
    status = remote.cli("status", "--json", job_id)
    outputs = [
        dry.stdout + dry.stderr,
        dry_json.stdout + dry_json.stderr,
        done.stdout + done.stderr,
        logs.stdout + logs.stderr,
        status.stdout + status.stderr,
    ]
    # remote.root: the login node's workdir (the run directory), the laptop's records, the client's HOME.
    assert leaks(HOSTILE, remote.root, *[os.fsencode(text) for text in outputs]) == []
    assert not (run_dir / ".secrets.env").exists()


def test_ssh_missing_secret_queues_nothing(remote: Remote) -> None:
    (remote.root / "missing").mkdir()
    recipe = secret_recipe(remote.root / "missing")
    profile = remote.profile("prod-secrets", "remote-missing")
    env = {key: value for key, value in remote.env().items() if key != "HF_TOKEN"}
    done = remote.cli(
        "submit", str(recipe), "--cluster", str(profile), "--executor", "ssh", "--set", "runs_dir=runs", env=env
    )
    assert done.returncode == 2 and "secret HF_TOKEN is not set" in done.stderr, done.stderr
    assert not (remote.root / "remote-missing" / "runs" / "sec").exists()

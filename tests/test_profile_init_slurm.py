"""`clusterkit profile init` on the real dev cluster: the profile it writes from what SLURM says is
one a recipe validates, renders and runs on (submitted, waited for, COMPLETED), found by its name
from the user's own profile folder; asked over SSH through an existing profile's login node, the new
profile names that login node. (In-process, against captured output: test_profile_init.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

import test_remote
from conftest import REPO, run_cli
from test_remote import Remote

pytestmark = pytest.mark.slurm
remote = test_remote.remote  # the login node (a real sshd) in front of the dev cluster, for this module too
SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")


def test_profile_init_writes_a_profile_a_job_runs_on(dev_cluster: str, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = run_cli("profile", "init", "dev-probed", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout)
    written = tmp_path / "config" / "clusterkit" / "clusters" / "dev-probed.yaml"
    assert said["path"] == str(written) and said["found_by_name"] and said["tiny_recipe_errors"] == []
    profile = yaml.safe_load(written.read_text())
    assert profile["partition"] == "debug" and "max_time" not in profile  # Default=YES, MaxTime=UNLIMITED
    assert profile["interconnect"] == "none" and profile["cpus_per_node"] >= 1
    # bin/dev-cluster gives each node two stand-in GPUs as GRES gpu when it may make device files (root)
    gres = profile["accelerator"] == "gpu"
    assert (profile["gpus_per_node"], profile["gpu_request"]) == ((2, "gres") if gres else (1, "none"))
    assert run_cli("profile", "init", "dev-probed", cwd=tmp_path, env=env).returncode == 2  # never replaced

    gpus = profile["gpus_per_node"]
    recipe = tmp_path / "probed.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "probed",
                "cluster": "dev-probed",  # by name: the user's clusters/ folder
                "launcher": "python",
                "runs_dir": str(tmp_path / "runs"),
                "resources": {"nodes": 1, "gpus_per_node": gpus, "cpus_per_task": 1, "time": "5"},
                "task": {"script": SCRIPT},
                "snapshot": False,
            }
        )
    )
    assert run_cli("validate", str(recipe), cwd=tmp_path, env=env).returncode == 0
    rendered = run_cli("render", str(recipe), "-o", str(tmp_path / "rendered"), cwd=tmp_path, env=env)
    assert rendered.returncode == 0, rendered.stderr
    header = (tmp_path / "rendered" / "job.sbatch").read_text()
    assert "#SBATCH --partition=debug" in header
    assert ("#SBATCH --gres=gpu:2" in header) == gres
    submitted = run_cli("submit", str(recipe), "--follow", "--json", cwd=tmp_path, env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    run = json.loads(submitted.stdout)
    assert run["status"]["state"] == "COMPLETED", run
    status = run_cli("status", run["run"]["job_id"], "--json", cwd=tmp_path, env=env)
    assert json.loads(status.stdout)["state"] == "COMPLETED"
    ranks = sorted((Path(run["run"]["run_dir"]) / "contract").glob("rank-*.json"))
    assert len(ranks) == gpus


def test_profile_init_over_ssh_asks_the_login_node_and_names_it(remote: Remote) -> None:
    existing = remote.profile("prod", "profile-init")
    out = remote.laptop / "probed-over-ssh.yaml"
    done = remote.cli("profile", "init", "probed", "--cluster", str(existing), "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    written = yaml.safe_load(text)
    assert written["login"]["host"] == "cluster-login" and written["partition"] == "debug"
    assert "asked on this machine" not in text and "the tiny recipe (tiny-gpt2-cpu) validates on it" in done.stdout

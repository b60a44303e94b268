"""Shared fixtures. The SLURM tests run against the real dev cluster (bin/dev-cluster), started
once per session; the training tests run real torchrun / DeepSpeed processes on CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
SHIPPED_RECIPES = sorted(RECIPES.glob("*.yaml"))
# Public launch scripts ported to recipes (recipes/ported/README.md names each source and commit).
PORTED_RECIPES = sorted((RECIPES / "ported").glob("*.yaml"))


# The fast tier (bin/test --fast, under two minutes on two cores): the modules that test clusterkit's
# own logic, in-process or through the CLI, against fakes at the Host and job-environment seams; no
# dev cluster, no SSH server, no job that trains, no pip. bin/test runs them all, and everything else.
FAST_MODULES = {
    "test_completion", "test_containers", "test_container_runtimes", "test_doctor", "test_dry_run_display", "test_errors",
    "test_format_hints", "test_gpu_defaults", "test_gpus", "test_help_examples", "test_import_script", "test_layers", "test_layout_and_profile_options",
    "test_into_job", "test_launch_plan", "test_lifecycle", "test_node_agent", "test_plan", "test_preemption_local", "test_profile_checks", "test_profile_init", "test_ported_script_checks", "test_python_argv",
    "test_collective_forensics", "test_recipe_input_holes", "test_render", "test_render_output", "test_resolved", "test_rich_text",
    "test_run_diff", "test_run_layout", "test_run_report", "test_sacct_status", "test_slurm_accounting", "test_runner_units", "test_schema", "test_service_role", "test_spares", "test_stacks", "test_startup_imports",
    "test_stragglers", "test_style", "test_supervisor", "test_template_cache", "test_template_errors", "test_top", "test_user_cache",
    "test_validation",
    "test_env_values", "test_program_args", "test_enroot",
    "test_function_jobs",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module.__name__ in FAST_MODULES and not {"slurm", "train"} & {m.name for m in item.iter_markers()}:
            item.add_marker(pytest.mark.fast)


def interruptible() -> None:
    """A child's preexec_fn for tests that Ctrl-C it: SIGINT back to its default. A shell without job
    control starts background commands (``bin/test &``, nohup in a script) with SIGINT ignored, the
    children inherit that, and Python then installs no KeyboardInterrupt: the test's Ctrl-C would be
    lost and the test hang, for a reason that is the runner's, not clusterkit's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "clusterkit.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[str]:
    """Start (or reuse) the local three-node SLURM cluster; yields its SLURM_CONF. A cluster this
    session started is stopped at the end; one that was already running is left running. A cluster
    that answers at the SLURM_CONF already set is used as it is (a second checkout's tests beside the
    first one's cluster: only one dev cluster can run on a machine, its ports are fixed)."""
    named = os.environ.get("SLURM_CONF")
    if named and " is UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout:
        yield named
        return
    script = str(REPO / "bin" / "dev-cluster")
    was_running = "slurmctld: running" in subprocess.run([script, "status"], capture_output=True, text=True).stdout
    done = subprocess.run([script, "up"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"bin/dev-cluster up failed:\n{done.stdout}\n{done.stderr}")
    conf = subprocess.run([script, "env"], capture_output=True, text=True).stdout
    slurm_conf = conf.strip().split("=", 1)[1]
    os.environ["SLURM_CONF"] = slurm_conf
    yield slurm_conf
    if not was_running:
        subprocess.run([script, "down"], capture_output=True, timeout=120)


@pytest.fixture(scope="session", autouse=True)
def _torch_extensions_cache() -> None:
    # DeepSpeed JIT-compiles its CPU comm op once (~33 s); keep it across tests and runs.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch-extensions"))


@pytest.fixture(scope="session", autouse=True)
def _own_config_and_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite neither reads the user's config (~/.config/clusterkit) nor adds to their run
    index (~/.local/state/clusterkit): both are XDG dirs of its own, empty, for every process."""
    home = tmp_path_factory.mktemp("xdg")
    os.environ.pop("CLUSTERKIT_CONFIG", None)
    os.environ["XDG_CONFIG_HOME"] = str(home / "config")
    os.environ["XDG_STATE_HOME"] = str(home / "state")

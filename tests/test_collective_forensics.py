"""Issue 28, part 4, as settings (no GPU here): on a GPU (NCCL) profile the job's environment turns
on PyTorch's NCCL flight recorder, dumping into the run directory; the recipe's collective_timeout
reaches a script as an env variable (and the built-in runner as ddp_timeout: test_runner_units).
A CPU (gloo) profile gets none of the NCCL ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clusterkit import load_recipe
from clusterkit.render.job import render_job
from clusterkit.spec import layout
from clusterkit.spec.network import COLLECTIVE_TIMEOUT_ENV, network_env
from conftest import RECIPES

FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


def _exports(env_sh: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(.*)$", env_sh, re.M))


def test_a_gpu_profile_records_and_dumps_nccl_collectives_into_the_run_dir() -> None:
    loaded = load_recipe(RECIPES / "llama-7b-zero3-ib.yaml", ["collective_timeout=30m"])
    assert loaded.profile.accelerator == "gpu"
    exports = _exports(render_job(loaded).files[layout.ENV_SCRIPT])
    assert exports["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert exports["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert exports["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert exports["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f'"$RUN_DIR"/{layout.NCCL_TRACE_DIR}/rank_'
    assert exports[COLLECTIVE_TIMEOUT_ENV] == "1800"


def test_the_flight_recorder_is_set_whatever_the_network_profile_and_the_recipe_may_change_it() -> None:
    loaded = load_recipe(
        RECIPES / "llama-7b-zero3-ib.yaml", ["network.profile=none", "env.TORCH_NCCL_TRACE_BUFFER_SIZE=20000"]
    )
    names = {var.name: var.value for var in network_env(loaded.recipe, loaded.profile)}
    assert FLIGHT_RECORDER <= set(names) and names["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000"
    assert COLLECTIVE_TIMEOUT_ENV not in names  # not set in the recipe: the Trainer's or the script's own


@pytest.mark.parametrize("timeout", [None, "90"])
def test_a_cpu_profile_has_no_flight_recorder(timeout: str | None) -> None:
    loaded = load_recipe(RECIPES / "tiny-gpt2-cpu.yaml", [f"collective_timeout={timeout}"] if timeout else [])
    assert loaded.profile.accelerator == "cpu"
    exports = _exports(render_job(loaded).files[layout.ENV_SCRIPT])
    assert not FLIGHT_RECORDER & set(exports)
    assert exports.get(COLLECTIVE_TIMEOUT_ENV) == ("90" if timeout else None)


@pytest.mark.parametrize("bad", ["0", "30x", "-5", "1e3", "8d", "'30m; rm -rf ~'"])
def test_a_bad_collective_timeout_stops_at_validation(bad: str, tmp_path: Path) -> None:
    from conftest import run_cli

    done = run_cli("validate", str(RECIPES / "tiny-gpt2-cpu.yaml"), "--set", f"collective_timeout={bad}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "collective_timeout" in done.stderr and "Traceback" not in done.stderr

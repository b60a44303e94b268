"""Issue 14's lifecycle flags as first-class fields: --time-min, --wait-all-nodes, and --requeue /
--signal on and off (or left to the site), each rendered as written or refused where they contradict."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from conftest import REPO
from launch_plans import plan_of

SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")


def _header(tmp_path: Path, resources: dict | None = None, preemption: dict | None = None) -> list[str]:
    body = {
        "name": "life",
        "cluster": "dev",
        "resources": {"nodes": 1, "time": "30", **(resources or {})},
        "task": {"script": SCRIPT},
        **({"preemption": preemption} if preemption else {}),
    }
    path = tmp_path / "life.yaml"
    path.write_text(yaml.safe_dump(body))
    job = render_job(load_recipe(path))
    # The supervisor passes this signal on (and exports it to the ranks as CLUSTERKIT_PREEMPT_SIGNAL).
    return [line for line in job.script.splitlines() if line.startswith("#SBATCH")] + [
        f"passes on {plan_of(job).recovery.signal}"
    ]


def test_time_min_and_wait_all_nodes_are_written_as_asked(tmp_path: Path) -> None:
    lines = _header(tmp_path, {"time_min": "10", "wait_all_nodes": True})
    assert "#SBATCH --time-min=10" in lines and "#SBATCH --wait-all-nodes=1" in lines
    plain = _header(tmp_path)
    assert not [line for line in plain if "time-min" in line or "wait-all-nodes" in line]


@pytest.mark.parametrize(
    "preemption, present, absent",
    [
        ({}, ["#SBATCH --requeue", "#SBATCH --signal=B:USR2@120"], ["#SBATCH --no-requeue"]),
        ({"max_requeues": 0}, ["#SBATCH --no-requeue"], ["#SBATCH --requeue"]),
        ({"requeue": True, "max_requeues": 0}, ["#SBATCH --requeue"], ["#SBATCH --no-requeue"]),
        ({"requeue": False, "max_requeues": 0}, ["#SBATCH --no-requeue"], ["#SBATCH --requeue"]),
        ({"requeue": "site"}, [], ["#SBATCH --requeue", "#SBATCH --no-requeue"]),
        ({"signal": False, "max_requeues": 0}, ["passes on USR2"], ["#SBATCH --signal=B:USR2@120"]),
        ({"signal": "TERM", "grace_s": 60}, ["#SBATCH --signal=B:TERM@60", "passes on TERM"], []),
    ],
)
def test_requeue_and_signal_are_on_off_or_the_sites(
    tmp_path: Path, preemption: dict, present: list, absent: list
) -> None:
    lines = _header(tmp_path, preemption=preemption)
    assert all(line in lines for line in present), lines
    assert not any(line in lines for line in absent), lines


@pytest.mark.parametrize(
    "resources, preemption, message",
    [
        ({"time_min": "40"}, None, "resources.time_min: 40 is longer than resources.time 30"),
        ({}, {"requeue": False}, "preemption.requeue: false, but max_requeues is 3"),
        ({}, {"signal": True}, "preemption.signal: true: name the signal"),
        ({"extra_sbatch": {"time-min": "5"}}, None, "--time-min is written by clusterkit; set resources.time_min"),
        ({"extra_sbatch": {"no-requeue": True}}, None, "set preemption.requeue"),
        ({"extra_sbatch": {"wait-all-nodes": 1}}, None, "set resources.wait_all_nodes"),
    ],
)
def test_contradicting_lifecycle_settings_are_refused(
    tmp_path: Path, resources: dict, preemption: dict | None, message: str
) -> None:
    with pytest.raises(RecipeError) as raised:
        _header(tmp_path, resources, preemption)
    assert message in str(raised.value)

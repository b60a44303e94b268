"""Text from users, jobs and tools goes through rich as text, never as markup: a ``[train]`` or
``[rank1]`` is shown as written and a ``[/]`` does not raise."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from rich.console import Console

from clusterkit.runs.follow import follow
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import FAILED, RUNNING, JobStatus
from conftest import REPO
from without_torch import run_cli_without_torch

MARKUP_LIKE = "[rank1]: [/bold] [/] [red]x :thumbs_up:"


def test_doctor_install_hint_keeps_the_extra() -> None:
    done = run_cli_without_torch("doctor", cwd=REPO, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 1, done.stderr  # no torch fails the check
    torch_row = next(line for line in done.stdout.splitlines() if "torch is not importable" in line)
    assert "pip install 'clusterkit[train]'" in torch_row


def test_follow_prints_job_text_verbatim(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps(record) + "\n"
            for record in (
                {"event": "start", "step": 0, "max_steps": 10, "world_size": 2},
                {"event": "log", "step": 4, "max_steps": 10, "loss": 2.5, "world_size": MARKUP_LIKE},
                {
                    "event": "log",
                    "step": 5,
                    "max_steps": 10,
                    "loss": MARKUP_LIKE,
                    "world_size": "[/]",
                },  # a runner's own values
                {
                    "event": "log",
                    "step": "[/bold]",
                    "max_steps": "[/]",
                    "loss": 1.25,
                    "samples_per_s": 3.0,
                    "world_size": 2,
                },
            )
        )
    )
    record = RunRecord(
        job_id="42",
        name="[/]name",
        scheduler="local",
        run_dir=str(tmp_path),
        recipe="r.yaml",
        submitted_at=0.0,
        nodes=1,
        ranks_per_node=2,
        launcher="torchrun",
    )
    answers = iter([JobStatus(RUNNING), JobStatus(FAILED, exit_code=1, failure=f"{MARKUP_LIKE} RuntimeError")])
    out = io.StringIO()
    final = follow(record, lambda _: next(answers), metrics, console=Console(file=out, width=400), poll_s=0)
    text = out.getvalue()
    assert final.state == FAILED
    assert f"step 4, loss 2.5000, world {MARKUP_LIKE}\n" in text
    assert f"step 5, loss {MARKUP_LIKE}, world [/]" in text
    assert "step [/bold], loss 1.2500, 3.0 samples/s, world 2" in text
    assert f"job 42 {FAILED} (exit code 1)" in text
    assert f"first failure: {MARKUP_LIKE} RuntimeError" in text

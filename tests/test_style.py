"""The code is ruff-clean: the linter's rules and the formatter's style as pyproject.toml's [tool.ruff]
sets them, over the whole repository (ruff is in the [test] extra, one minor series)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff comes with the [test] extra (bin/setup)")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_finds_nothing() -> None:
    done = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_code_is_formatted() -> None:
    done = _ruff("format", "--no-cache", "--check", ".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]

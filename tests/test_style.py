"""The code is ruff-clean: the linter's rules and the formatter's style as pyproject.toml's [tool.ruff]
sets them, over the whole repository (ruff is in the [test] extra, one minor series)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# PENDING the formatting commit: the configuration landed before the code was formatted and its few
# remaining findings fixed. That commit (`ruff format . && ruff check --fix .`, then the rest by
# hand) removes this marker; strict, so a passing run fails until it is removed.
PENDING_FORMAT = pytest.mark.xfail(strict=True, reason="the code is not ruff-formatted yet (remove in that commit)")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff comes with the [test] extra (bin/setup)")
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@PENDING_FORMAT
def test_ruff_check_finds_nothing() -> None:
    done = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


@PENDING_FORMAT
def test_the_code_is_formatted() -> None:
    done = _ruff("format", "--no-cache", "--check", ".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]

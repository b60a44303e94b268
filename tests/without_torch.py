"""The CLI as a login node without torch runs it: torch is on this machine, so the child makes
``import torch`` fail (``sys.modules['torch'] = None``) before clusterkit starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_NO_TORCH = (
    "import sys; sys.modules['torch'] = None; from clusterkit.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def run_cli_without_torch(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )

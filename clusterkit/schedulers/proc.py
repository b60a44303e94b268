"""The one seam through which clusterkit runs scheduler commands (sbatch, squeue, scontrol, scancel)."""

from __future__ import annotations

import subprocess
from typing import Sequence

from clusterkit.errors import SchedulerError


def run(argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SchedulerError(f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{' '.join(argv)}: no answer within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise SchedulerError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done

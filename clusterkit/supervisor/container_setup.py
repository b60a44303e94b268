"""A container made before the job's steps run in it and removed when the job ends (enroot, called
directly: :class:`.plan.ContainerSetup`): its image imported on the first node, the container created
on every node, and at the end removed from every node with the imported image, however the job ended."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .plan import ContainerSetup, Step


def make(setup: ContainerSetup, run_dir: Path, run: Callable[[Step], int]) -> int:
    """Import and create, each step run by ``run`` on its nodes; the first failure's exit code, or 0."""
    if setup.imported:  # an earlier attempt's (a requeue), which enroot import would not overwrite
        (run_dir / setup.imported).unlink(missing_ok=True)
    for step in filter(None, (setup.import_, setup.create)):
        code = run(step)
        if code:
            print(f"clusterkit: the container could not be made ready ({code}): not training", flush=True)
            return code
    return 0


def remove(setup: ContainerSetup, run_dir: Path, run: Callable[[Step], int]) -> None:
    code = run(setup.remove)
    if code:
        print(f"clusterkit: enroot remove exited with {code}: a node may keep the job's container", flush=True)
    if setup.imported:
        (run_dir / setup.imported).unlink(missing_ok=True)

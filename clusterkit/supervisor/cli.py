"""``python3 <run dir>/supervisor COMMAND ...``:

- ``batch PLAN``: the batch shell's part of the job (:mod:`.batch`);
- ``node PLAN STEP``: one task of a step, around its program (:mod:`.node`);
- ``rank [--module] ENTRY ARGS...``: one rank started by a launcher in the batch shell (:mod:`.ranks`);
- ``ray-node ROLE OPTIONS...``: a node of launcher: ray's cluster (:mod:`.ray_cluster`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List

USAGE = "usage: supervisor batch PLAN | node PLAN STEP | rank [--module] ENTRY [ARGS...] | ray-node ROLE [OPTIONS...]"


def main(argv: List[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "batch" and len(args) == 1:
        from .batch import main as batch

        return batch(args[0])
    if command == "node" and len(args) == 2:
        from .node import run_task
        from .plan import load_plan

        plan = load_plan(Path(args[0]).read_text())
        steps = {
            step.name: step
            for step in (
                plan.launch,
                plan.preflight,
                plan.image_check,
                plan.service.step if plan.service else None,
                plan.ray.head if plan.ray else None,
                plan.ray.workers if plan.ray else None,
                *plan.steps,  # a job of several steps: their names are none of the others' (load refuses those)
                *(component.step for component in plan.components),  # nor are components' (spec.components)
            )
            if step
        }
        return run_task(plan, steps[args[1]], os.environ)
    if command == "rank" and args:
        from .ranks import run_as_rank

        run_as_rank(args)
        return 0
    if command == "ray-node":
        from .ray_cluster import main as ray

        code = ray(argv)
        if code is not None:
            return code
    print(USAGE, file=sys.stderr)
    return 2

"""Time lost to a dead node on the idle dev cluster: with a hot spare (the launch restarts in the
same job on node3) against the retry as a new job (sbatch of a held retry excluding the node, then
its start). The same tiny 2 x 2 recipe each time; every rank on node2 is SIGKILLed once training is
past its first complete checkpoint; the time lost is from the kill to rank 0's next training step.

Run from the repo root with the dev cluster up (bin/dev-cluster up):

    python bench/recovery.py [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the dev-cluster test helpers: submit, kill, read a run

from clusterkit.spec.layout import CHECKPOINTS_DIR, COMPLETE, RETRIES, checkpoint_name  # noqa: E402
from slurm_jobs import first_step_after, kill_ranks_on, metrics, start, wait, wait_done  # noqa: E402

STEPS = ("--set", "task.trainer.args.max_steps=80", "--set", "task.trainer.args.save_steps=20")
WAYS = {
    "spare (same job)": ("--set", "resources.spare_nodes=1"),
    "retry (new job)": ("--set", "preemption.max_retries=1"),
}


def one_round(way: tuple[str, ...], workdir: Path) -> float:
    job_id, run_dir = start(workdir, *STEPS, *way)
    wait((run_dir / CHECKPOINTS_DIR / checkpoint_name(20) / COMPLETE).exists, 300, "the first checkpoint")
    wait(lambda: any(m.get("step", 0) > 20 for m in metrics(run_dir)), 120, "steps past it")
    killed_at = kill_ranks_on(job_id, "node2")
    wait(lambda: first_step_after(run_dir, killed_at) is not None, 600, "training again")
    lost = first_step_after(run_dir, killed_at)["time"] - killed_at
    retried = (run_dir / RETRIES).exists()
    final = json.loads((run_dir / RETRIES).read_text().splitlines()[-1])["job_id"] if retried else job_id
    assert " COMPLETED " in wait_done(final, run_dir, timeout=600)
    return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="clusterkit-recovery-") as tmp:
        for name, way in WAYS.items():
            results[name] = [one_round(way, Path(tmp) / f"{name[:5]}{i}") for i in range(args.rounds)]
    if args.json:
        print(json.dumps(results))
    for name, lost in results.items():
        print(f"{name:18} time lost: median {statistics.median(lost):.1f} s  ({', '.join(f'{s:.1f}' for s in lost)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

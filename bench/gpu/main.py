"""``python -m bench.gpu.main`` (through bench/gpu/run.sh): issue 25's proof on one GPU in one call.

Parts, in this order, each within its share of the time (bench/gpu/sizes.py) and never past the
deadline: node (doctor, preflight), ablation (seed 004 on a ~1B Llama), fsdp (FSDP2 on world 1,
checkpoint, resume), planner (ZeRO-2 offload; then every measured peak against `plan`), job (the
whole local job path). A part that fails records why and the next one runs; $OUT/results.json and
results.md are rewritten after every step. Exit 1 when anything failed, with the list; a goal
measured and missed (MFU, plan off by >10%) is reported, not a failure.

Without CUDA (or with CLUSTERKIT_GPU_REHEARSAL=1) it rehearses: tiny sizes, same code."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu import ablation, fsdp, job, node, planner
from bench.gpu.context import Context, Results
from bench.gpu.recipes import write_profile
from bench.gpu.report import findings, render
from bench.gpu.sizes import sizes_for

PARTS: dict[str, Callable[[Context, dict[str, Any], float], None]] = {
    "node": node.run,
    "ablation": ablation.run,
    "fsdp": fsdp.run,
    "planner": planner.run,
    "job": job.run,
}
MIN_PART_S = 10.0
OPTIONAL = {"job"}  # beyond issue 25's list: skipped for time, it is no failure
WORK_NAME = "clusterkit-gpu-bench"
SHM_NEEDED = 24 * 2**30  # a 1B model's final save (4 GiB) plus FSDP checkpoints, with room


def work_dir(mode: str) -> Path:
    """Our own folder for run directories: in /dev/shm on the GPU machine when it is big enough (the
    runner's final 4 GiB save then costs no disk), else the temporary directory."""
    if os.environ.get("BENCH_WORK"):
        base = Path(os.environ["BENCH_WORK"])
    elif mode == "gpu" and os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free >= SHM_NEEDED:
        base = Path("/dev/shm")
    else:
        base = Path(os.environ.get("TMPDIR", "/tmp"))
    work = base / WORK_NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def isolate(work: Path) -> None:
    """The runs read no user config (profile folders, runs_dir) and add nothing to the user's run
    index: every process gets configuration and state folders of its own, under work."""
    for name in ("CLUSTERKIT_CONFIG", "CLUSTERKIT_CLUSTERS"):
        os.environ.pop(name, None)
    os.environ["XDG_CONFIG_HOME"] = str(work / "xdg-config")
    os.environ["XDG_STATE_HOME"] = str(work / "xdg-state")


def device_facts(repo: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu.device"], cwd=repo, capture_output=True, text=True, timeout=180, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.gpu.device failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_params(sizes: Any) -> int:
    from clusterkit.estimate.modelsize import model_shape

    return model_shape(sizes.model, sizes.seq_len).params


def main() -> int:
    repo = Path(__file__).resolve().parents[2]
    out = Path(os.environ.get("OUT") or sys.exit("bench: set OUT to the folder for the results"))
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out, render)
    data = results.data
    data["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        device = device_facts(repo)
    except Exception as exc:  # nothing else can run without knowing the machine
        results.fail("device", f"{type(exc).__name__}: {exc}")
        results.save()
        print(f"bench: {data['failures'][0]}", file=sys.stderr)
        return 1
    rehearsal = os.environ.get("CLUSTERKIT_GPU_REHEARSAL") == "1" or device.get("capability") is None
    mode = "rehearsal" if rehearsal else "gpu"
    sizes = sizes_for(mode)
    data.update(
        mode=mode,
        device=device,
        sizes={
            "model": sizes.model,
            "seq_len": sizes.seq_len,
            "micro_batch": sizes.micro_batch,
            "accumulation": sizes.accumulation,
        },
        model_params=model_params(sizes),
    )
    work = work_dir(mode)
    isolate(work)
    ctx = Context(repo, work, sizes, device, write_profile(work, device, mode), results)
    deadline = results.started + sizes.deadline_s
    wanted = [p for p in os.environ.get("BENCH_PARTS", ",".join(PARTS)).split(",") if p]
    print(
        f"bench: {mode} on {device['name']}, parts {', '.join(wanted)}, {sizes.deadline_s:.0f} s, work in {work}",
        flush=True,
    )
    for name in wanted:
        part = results.part(name)
        budget = min(sizes.budgets.get(name, 60.0), deadline - ctx.clock())
        if name not in PARTS or budget < MIN_PART_S:
            part.update(status="skipped", why="unknown part" if name not in PARTS else f"time: {budget:.0f} s for it")
            if name not in OPTIONAL:
                results.fail(name, part["why"])
            results.save()
            continue
        started = ctx.clock()
        print(f"bench: part {name}, {budget:.0f} s", flush=True)
        try:
            PARTS[name](ctx, part, budget)
            part.setdefault("status", "ok")
        except Exception as exc:
            part.update(status="failed", why=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2000:])
            results.fail(name, part["why"])
        part["seconds"] = round(ctx.clock() - started, 1)
        data["planner_vs_measured"] = planner.compare(data)
        results.save()
    for row_key, row in data.get("parts", {}).get("ablation", {}).get("rows", {}).items():
        if row.get("status") == "failed":
            results.fail(f"ablation {row_key}", str(row.get("why")))
    results.save()
    print((out / "results.md").read_text(), flush=True)
    if data.get("failures"):
        print("bench: FAILED:\n  " + "\n  ".join(data["failures"]), file=sys.stderr, flush=True)
        return 1
    missed = findings(data)
    print("bench: every part ran" + (f"; goals missed: {'; '.join(missed)}" if missed else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

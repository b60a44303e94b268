"""Benchmark: wall time of `clusterkit render` (a fresh process, as a user runs it) for a
64-node x 8-GPU recipe and a 4096-node x 8-GPU one. Target: median <= 200 ms, and the 4096-node
render costing about the same (nothing is done per node at render time). Also `clusterkit plan` of
the 7B recipe on 2 x 8 80 GB GPUs (target < 2 s).

    python bench/render_bench.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = """\
name: bench-{nodes}
cluster: infiniband-h100
launcher: deepspeed
resources: {{nodes: {nodes}, gpus_per_node: 8, time: "1-00:00:00"}}
parallelism: {{zero_stage: 3, micro_batch_size: 1, gradient_accumulation_steps: 4}}
task:
  trainer:
    model:
      config: {{model_type: llama, hidden_size: 4096, intermediate_size: 11008, num_hidden_layers: 32,
               num_attention_heads: 32, vocab_size: 32000}}
    dataset: {{type: synthetic, seq_len: 4096}}
    args: {{max_steps: 1000}}
"""


def cli_argv() -> list[str]:
    # The console script installed beside this interpreter (not a version-manager shim, which adds
    # its own start-up time), else the module.
    script = Path(sys.executable).parent / "clusterkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "clusterkit.cli.main"]


def measure(command: list[str], runs: int) -> list[float]:
    subprocess.run(command, check=True, capture_output=True)  # warm the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        commands = {}
        for nodes in (64, 4096):
            recipe = Path(tmp) / f"bench-{nodes}.yaml"
            recipe.write_text(RECIPE.format(nodes=nodes))
            commands[f"render {nodes:>4} nodes x 8 GPUs"] = [
                *cli_argv(),
                "render",
                str(recipe),
                "-o",
                f"{tmp}/out-{nodes}",
            ]
        seven_b = Path(__file__).resolve().parent.parent / "recipes" / "llama-7b-zero3-ib.yaml"
        commands["plan 7B on 2 x 8 GPUs"] = [*cli_argv(), "plan", str(seven_b), "--json"]
        for label, command in commands.items():
            times = sorted(measure(command, args.runs))
            print(
                f"{label}: median {statistics.median(times) * 1000:.0f} ms, "
                f"min {times[0] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms over {args.runs} runs"
            )


if __name__ == "__main__":
    main()

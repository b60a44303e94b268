"""A script task whose ranks all-reduce a seeded value each step and record it; with ``--hang-rank R
--hang-after S`` rank R stops after step S inside ``stuck_waiting_for_data`` (a sleep), while the
others block in the next all_reduce. Progress: the supervisor's heartbeat, touched each step.
Usage: hang_rank.py OUT_DIR STEPS [--hang-rank R --hang-after S] [--step-s SECONDS]"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def stuck_waiting_for_data() -> None:
    while True:
        time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-after", type=int, default=0)
    parser.add_argument("--step-s", type=float, default=0.2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    heartbeat = Path(os.environ["CLUSTERKIT_HEARTBEAT"])
    values = []
    for step in range(1, args.steps + 1):
        if rank == args.hang_rank and step > args.hang_after:
            stuck_waiting_for_data()
        value = torch.tensor([float(step * (rank + 1))])
        dist.all_reduce(value)
        values.append(value.item())
        (out / f"rank{rank}.values").write_text(" ".join(f"{v:g}" for v in values))
        if rank == 0:
            heartbeat.touch()
        time.sleep(args.step_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

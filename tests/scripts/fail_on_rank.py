"""Rank N (argv[1]) raises; every other rank blocks in a collective that can never complete."""

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == int(sys.argv[1]):
        time.sleep(1)
        raise RuntimeError(f"deliberate failure on rank {dist.get_rank()}")
    dist.all_reduce(torch.ones(1))  # waits for the failed rank forever
    time.sleep(3600)


main()

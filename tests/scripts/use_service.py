"""A training task that needs the service role: every rank reads the service's address from
$SERVICE_ADDR, asks it for a page over HTTP, joins the gloo group, and records what it got."""

import json
import os
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist

address = os.environ["SERVICE_ADDR"]
with urllib.request.urlopen(f"http://{address}/", timeout=30) as answer:
    status = answer.status
dist.init_process_group("gloo")
total = torch.tensor([1])
dist.all_reduce(total)
Path(os.environ["RUN_DIR"], f"service-seen-{dist.get_rank()}.json").write_text(
    json.dumps(
        {
            "address": address,
            "status": status,
            "world": dist.get_world_size(),
            "summed": total.item(),
            "node": os.environ["SLURMD_NODENAME"],
        }
    )
)
dist.destroy_process_group()

"""Training in a heterogeneous job (tests/test_components.py): a gloo group of its own ranks; at each
of its steps every rank asks the reward component (at the address the documented variables give)
over HTTP, and records what it was told and what it got."""

import json
import os
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist

addr = os.environ["CLUSTERKIT_COMPONENT_REWARD_ADDR"]
port = int(os.environ["CLUSTERKIT_COMPONENT_REWARD_PORT"])
dist.init_process_group("gloo")
answers = []
for step in range(5):
    with urllib.request.urlopen(f"http://{addr}:{port + step % 2}/", timeout=30) as answer:
        answers.append(json.loads(answer.read()))
    total = torch.tensor([1])
    dist.all_reduce(total)
    assert total.item() == dist.get_world_size()
told = {name: value for name, value in os.environ.items() if name.startswith("CLUSTERKIT_COMPONENT")}
Path(os.environ["RUN_DIR"], f"train-{dist.get_rank()}.json").write_text(
    json.dumps(
        {"world": dist.get_world_size(), "node": os.environ["SLURMD_NODENAME"], "told": told, "answers": answers}
    )
)
dist.destroy_process_group()

"""A user script for tests: records its argv and environment per rank into the run directory,
and asserts the launcher's env contract on every rank."""

import json
import os
import sys
from pathlib import Path

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
assert 0 <= rank < world, (rank, world)
assert 0 <= local_rank < int(os.environ.get("LOCAL_WORLD_SIZE", world)), local_rank
for name in ("MASTER_ADDR", "MASTER_PORT", "RUN_DIR"):
    assert os.environ.get(name), f"{name} missing on rank {rank}"
if os.environ.get("ENV_CONTRACT_INIT_PROCESS_GROUP") == "1":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    assert dist.get_world_size() == world and dist.get_rank() == rank
    total = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(total)
    assert total.item() == world * (world - 1) // 2, total.item()  # every rank took part
    dist.destroy_process_group()
out = Path(os.environ["RUN_DIR"]) / "contract"
out.mkdir(exist_ok=True)
(out / f"rank-{rank}.json").write_text(
    json.dumps(
        {
            "argv": sys.argv[1:],
            "env": {k: v for k, v in os.environ.items()},
            "node": os.environ.get("SLURMD_NODENAME"),
            "node_id": os.environ.get("SLURM_NODEID"),
        }
    )
)
print(f"echo_contract: rank {rank} of {world}", flush=True)
if os.environ.get("ENV_CONTRACT_FAIL_RANK") == str(rank):
    sys.exit(3)  # after its record: a failing rank whose job the hooks tests follow to the end

"""A user script for tests: one ZeRO step through accelerate, recording from inside each rank what
really ran: accelerate's distributed type, the DeepSpeed engine's ZeRO stage and world size, and
how much of a weight this rank holds. On CPU accelerate needs gloo named (it finds no backend)."""

import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator, InitProcessGroupKwargs

accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randn(8, 4))
loader = torch.utils.data.DataLoader(data, batch_size=2)
engine, optimizer, loader = accelerator.prepare(model, optimizer, loader)
x, y = next(iter(loader))
loss = torch.nn.functional.mse_loss(engine(x), y)
accelerator.backward(loss)
optimizer.step()
weight = engine.module.weight
shard = getattr(weight, "ds_tensor", None)  # ZeRO-3: this rank's partition of the weight
record = {
    "distributed_type": str(accelerator.distributed_type),
    "num_processes": accelerator.num_processes,
    "zero_stage": engine.zero_optimization_stage(),
    "engine_world_size": engine.world_size,
    "weight_numel": int(weight.ds_numel if shard is not None else weight.numel()),
    "local_weight_numel": int(shard.numel() if shard is not None else weight.numel()),
    "offload_optimizer": str(getattr(engine.zero_offload_optimizer(), "device", "none")),
    "loss": float(loss),
}
out = Path(os.environ["RUN_DIR"]) / "probe"
out.mkdir(exist_ok=True)
(out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(record))

"""What the GPU proof measures, in each mode: the model shapes, batches and steps, the time budget of
each part, and the GPU's bf16 peak for MFU. ``gpu``: the real run (one H100/H200, 8 minutes);
``rehearsal``: the same code path on CPU with tiny sizes, so the first device call is the real one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# Dense bf16 tensor-core peak per GPU in TFLOP/s (NVIDIA datasheets, without sparsity): the numbers the
# shipped cluster profiles give as gpu.peak_tflops (recipes/clusters/pyxis-h100.yaml: H100-SXM 989).
# The first name contained in torch.cuda.get_device_name() wins: GH200 before H200, the H100 variants
# before plain H100 (the SXM part, "NVIDIA H100 80GB HBM3").
BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)


def bf16_peak(device_name: str) -> tuple[float | None, str]:
    """(peak TFLOP/s, where it came from) for a device name; None where the table has no entry."""
    for key, peak in BF16_PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peak, f"datasheet dense bf16 for '{key}' (bench/gpu/sizes.py, as the shipped profiles)"
    return None, f"no bf16 peak known for '{device_name}': MFU not computed"


# TinyLlama-1.1B's shape, as the shipped llama-1b recipes: 1,100,048,384 parameters.
LLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
# FSDP2 smoke and the end-to-end job: mechanics, not speed (~0.1B; a checkpoint is a few hundred MB).
LLAMA_SMALL = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
}
LLAMA_TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 64,
}


@dataclass(frozen=True)
class Sizes:
    mode: str  # gpu | rehearsal
    model: dict[str, Any]
    seq_len: int
    micro_batch: int  # the ablation rows' micro batch ...
    accumulation: int  # ... and accumulation: the same tokens per optimizer step in every row
    warmup_steps: int
    measured_samples: int  # measured steps per row = max(3, this // samples per step)
    small_model: dict[str, Any]
    small_seq_len: int
    compile_rows: bool  # torch.compile rows (on CPU they need a C++ compiler and take minutes)
    # Seconds: the whole script's deadline from its start (run.sh's wheel install comes before: keep
    # ~20 s under the 8 minutes), and each part's share (a part gets at most what is left).
    deadline_s: float
    budgets: dict[str, float] = field(default_factory=dict)
    row_timeout_s: float = 120.0
    compile_row_timeout_s: float = 200.0

    def measured_steps(self, samples_per_step: int) -> int:
        return max(3, self.measured_samples // samples_per_step)


def budgets(defaults: dict[str, float]) -> dict[str, float]:
    """Each part's seconds, with BENCH_BUDGETS=ablation=380,job=0 overriding some (0: skip the part)."""
    chosen = dict(defaults)
    for item in filter(None, os.environ.get("BENCH_BUDGETS", "").split(",")):
        name, _, seconds = item.partition("=")
        chosen[name.strip()] = float(seconds)
    return chosen


def sizes_for(mode: str) -> Sizes:
    env = os.environ
    if mode == "gpu":
        return Sizes(
            mode,
            LLAMA_1B,
            2048,
            micro_batch=1,
            accumulation=8,
            warmup_steps=2,
            measured_samples=80,
            small_model=LLAMA_SMALL,
            small_seq_len=1024,
            compile_rows=env.get("BENCH_COMPILE", "1") == "1",
            deadline_s=float(env.get("BENCH_DEADLINE_S", "450")),
            budgets=budgets({"node": 35, "ablation": 290, "fsdp": 60, "planner": 55, "job": 40}),
        )
    return Sizes(
        mode,
        LLAMA_TINY,
        64,
        micro_batch=1,
        accumulation=2,
        warmup_steps=1,
        measured_samples=4,
        small_model=LLAMA_TINY,
        small_seq_len=64,
        compile_rows=env.get("BENCH_COMPILE", "0") == "1",
        deadline_s=float(env.get("BENCH_DEADLINE_S", "1800")),
        budgets=budgets({"node": 120, "ablation": 900, "fsdp": 240, "planner": 240, "job": 240}),
        row_timeout_s=180.0,
        compile_row_timeout_s=600.0,
    )

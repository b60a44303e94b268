"""``clusterkit plan``: will it fit, and which layout is fastest on this cluster?

The usual rules for choosing a parallel strategy as executable advice, plus a search over every valid (dp, tp, pp, ZeRO
stage, offload, micro batch, accumulation, gradient checkpointing) ranked by a simple cost model:
compute from 6·N·tokens FLOPs at the profile's peak and an assumed efficiency; communication from
each strategy's volume over the profile's intra- and inter-node bandwidth; the pipeline bubble.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from clusterkit.errors import UserError
from clusterkit.estimate.memory import GIB, Layout, MemoryEstimate, estimate, fused_attention, optimizer_kind
from clusterkit.estimate.modelsize import ModelShape, UnknownArchitecture, model_shape
from clusterkit.load.loader import LoadedRecipe
from clusterkit.load.parallel_checks import AUTOTP_UNSUPPORTED

ASSUMED_MFU = 0.40  # fraction of peak FLOP/s a well-tuned transformer step reaches
SLOW_INTER_NODE_GBPS = 12.5  # per GPU; below ~100 Gb/s, keep DP/TP traffic inside nodes
OFFLOAD_PCIE_GBPS = 25.0  # host<->GPU copies for offloaded states
CPU_ADAM_PARAMS_PER_S = 1e9  # optimizer step on the host, per GPU's partition
MAX_MICRO_BATCH = 64
# Ranking only: a layout must be this much faster per ZeRO stage (and per offload) to beat a simpler
# one: "DDP when the model fits; ZeRO only if it helps".
COMPLEXITY_PENALTY = 0.01
SIZE_ONLY = "unknown"  # the family of a model known by its size alone (task.model_size)


class PlanError(UserError, ValueError):
    """The recipe or the arguments give nothing to plan with (no model shape, no GPU memory in the profile)."""


@dataclass(frozen=True)
class Advice:
    rule: (
        str  # fits-one-gpu | needs-sharding | largest-layer | slow-network | zero-with-pp | multiple-of-8 | lr-scaling
    )
    text: str


@dataclass(frozen=True)
class RankedLayout:
    layout: Layout
    memory: MemoryEstimate
    step_s: float
    tokens_per_s: float
    why: str


@dataclass
class Plan:
    shape: ModelShape
    gpu_memory: int
    current: Layout
    current_memory: MemoryEstimate
    advice: list[Advice] = field(default_factory=list)
    ranked: list[RankedLayout] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def mem(m: MemoryEstimate) -> dict[str, Any]:
            return {
                "weights": m.weights,
                "gradients": m.gradients,
                "optimizer": m.optimizer,
                "activations": m.activations,
                "overhead": m.overhead,
                "total": m.total,
                "host_per_node": m.host_per_node,
            }

        return {
            "model": vars(self.shape),
            "gpu_memory": self.gpu_memory,
            "current": {
                "layout": vars(self.current),
                "memory": mem(self.current_memory),
                "fits": self.current_memory.total <= self.gpu_memory,
            },
            "advice": [vars(a) for a in self.advice],
            "notes": self.notes,
            "ranked": [
                {
                    "layout": vars(r.layout),
                    "memory": mem(r.memory),
                    "step_s": r.step_s,
                    "tokens_per_s": r.tokens_per_s,
                    "why": r.why,
                }
                for r in self.ranked
            ],
        }


def shape_of(loaded: LoadedRecipe) -> ModelShape:
    task = loaded.recipe.task
    seq_len = task.trainer.dataset.seq_len if task.trainer else None
    if loaded.model_config is not None:
        try:
            return model_shape(loaded.model_config, seq_len)
        except UnknownArchitecture as exc:
            raise PlanError(str(exc)) from None
    if task.model_size:
        # A user script that only gives its size: model states are exact, activations unknown.
        return ModelShape(task.model_size, 1, 0, 1, 0, 0, 0, 0, SIZE_ONLY)
    raise PlanError(
        "plan needs the model's shape: task.trainer.model.config (dict or local config.json), "
        "task.model_config, or task.model_size"
    )


def _cost(shape: ModelShape, layout: Layout, global_batch: int, loaded: LoadedRecipe) -> tuple[float, str]:
    profile, r = loaded.profile, loaded.recipe.resources
    gpus = layout.dp * layout.tp * layout.pp
    peak = (profile.gpu.peak_tflops if profile.gpu and profile.gpu.peak_tflops else 100.0) * 1e12
    intra = (profile.intra_node_gbps or 100.0) * 1e9
    inter = (profile.inter_node_gbps or 12.5) * 1e9 if r.nodes > 1 else intra
    tokens = global_batch * shape.seq_len if shape.seq_len else global_batch
    flops = (8 if layout.gradient_checkpointing else 6) * shape.params * tokens  # recompute adds a forward
    m = layout.gradient_accumulation_steps
    compute = flops / (gpus * peak * ASSUMED_MFU) * (m + layout.pp - 1) / m  # pipeline bubble
    gpus_per_node = r.gpus_per_node
    bytes_per = 2 if loaded.recipe.precision != "fp32" else 4
    shard = shape.params / (layout.tp * layout.pp) * bytes_per
    dp_link = intra if layout.dp * layout.tp <= gpus_per_node else inter
    ring = (layout.dp - 1) / layout.dp if layout.dp > 1 else 0.0
    if layout.zero_stage == 3:
        dp_comm = 3 * ring * shard * m / dp_link  # all-gather fwd + bwd, reduce-scatter, every micro-batch
    elif layout.zero_stage > 0:
        dp_comm = (m + 1) * ring * shard / dp_link  # reduce-scatter every micro-batch, all-gather per step
    else:
        dp_comm = 2 * ring * shard / dp_link  # DDP: one all-reduce per step (no_sync while accumulating)
    activation = shape.seq_len * layout.micro_batch_size * shape.hidden * bytes_per
    tp_comm = (
        (4 * 2 * (layout.tp - 1) / layout.tp * activation * shape.layers / layout.pp * m / intra)
        if layout.tp > 1
        else 0.0
    )
    pp_link = intra if layout.tp * layout.dp * layout.pp <= gpus_per_node else inter
    pp_comm = 2 * activation * m / pp_link if layout.pp > 1 else 0.0
    offload = 0.0
    if layout.offload_optimizer != "none":
        per_gpu = shape.params / (layout.tp * layout.pp * layout.dp)
        offload += 6 * per_gpu / (OFFLOAD_PCIE_GBPS * 1e9) + per_gpu / CPU_ADAM_PARAMS_PER_S
    if layout.offload_params != "none":
        offload += 2 * 2 * shard / layout.dp * m / (OFFLOAD_PCIE_GBPS * 1e9)
    parts = {"compute": compute, "DP/ZeRO comm": dp_comm, "TP comm": tp_comm, "PP comm": pp_comm, "offload": offload}
    dominant = sorted((v, k) for k, v in parts.items() if k != "compute" and v > 0)
    note = f"{dominant[-1][1]} {dominant[-1][0]:.2f}s" if dominant else "no communication"
    return sum(parts.values()), note


def _divisors(n: int) -> list[int]:
    """In O(sqrt n): ``n`` may be a world of millions of GPUs."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def candidate_layouts(shape: ModelShape, loaded: LoadedRecipe, global_batch: int) -> list[Layout]:
    recipe = loaded.recipe
    gpus_per_node = recipe.resources.gpus_per_node
    # The recipe's cp stays as written: the layouts share out the ranks of one context-parallel group.
    world = recipe.world_size // recipe.parallelism.cp
    # The built-in runner: data parallel, ZeRO, and tp through DeepSpeed AutoTP (ZeRO 0-2, families it shards).
    builtin_runner = recipe.task.trainer is not None
    model_type = str((loaded.model_config or {}).get("model_type", "")).lower()
    autotp = builtin_runner and model_type not in ("", *AUTOTP_UNSUPPORTED)
    # Only the model's size known (task.model_size): its layers and heads are not, so they constrain no split.
    known = shape.family != SIZE_ONLY
    layouts = []
    for tp in _divisors(gpus_per_node) if autotp or not builtin_runner else [1]:
        if known and shape.heads % tp:
            continue
        for pp in [1] if builtin_runner else _divisors(world // tp):
            if (known and shape.layers % pp) or (world // tp) % pp:
                continue
            dp = world // (tp * pp)
            if global_batch % dp or dp % recipe.parallelism.ep:
                continue
            for stage in [0, 1] if pp > 1 else [0, 1, 2] if builtin_runner and tp > 1 else [0, 1, 2, 3]:
                offloads = (
                    [("none", "none")]
                    + ([("cpu", "none")] if stage >= 1 else [])
                    + ([("cpu", "cpu")] if stage == 3 else [])
                )
                for offload_optimizer, offload_params in offloads:
                    per_replica = global_batch // dp
                    for micro in (d for d in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % d == 0):
                        for checkpointing in (False, True):
                            layouts.append(
                                Layout(
                                    dp,
                                    tp,
                                    pp,
                                    stage,
                                    offload_optimizer,
                                    offload_params,
                                    micro,
                                    global_batch // (dp * micro),
                                    checkpointing,
                                    recipe.parallelism.cp,
                                )
                            )
    return layouts


def advise(shape: ModelShape, loaded: LoadedRecipe, gpu_memory: int, estimate_for: Any) -> list[Advice]:
    """The rules for choosing a strategy, applied to this model and cluster."""
    recipe, profile = loaded.recipe, loaded.profile
    advice = []
    single = estimate_for(Layout(dp=1))
    if single.total <= gpu_memory:
        advice.append(
            Advice(
                "fits-one-gpu",
                f"the model fits on one GPU ({single.total / GIB:.1f} of {gpu_memory / GIB:.0f} GiB): "
                "use plain DDP (zero_stage 0); ZeRO only if it frees memory for a larger micro batch",
            )
        )
    else:
        advice.append(
            Advice(
                "needs-sharding",
                f"the model does not fit on one GPU ({single.total / GIB:.1f} GiB > {gpu_memory / GIB:.0f} GiB): "
                "shard it with ZeRO-3, or split it with TP (inside a node) / PP",
            )
        )
    mixed = recipe.precision != "fp32"
    largest = shape.largest_layer_params * ((2 if mixed else 4) * 2 + (16 if mixed else 12))
    if largest > gpu_memory:
        advice.append(
            Advice(
                "largest-layer",
                f"the largest layer alone needs {largest / GIB:.1f} GiB with its gradients and optimizer "
                "state: split it with TP, or use ZeRO-3 (with parameter offload)",
            )
        )
    if recipe.resources.nodes > 1 and (profile.inter_node_gbps or 0) < SLOW_INTER_NODE_GBPS:
        advice.append(
            Advice(
                "slow-network",
                f"{profile.inter_node_gbps or 'unknown'} GB/s between nodes is slow: put PP across nodes, "
                "TP inside a node, and keep DP groups small",
            )
        )
    if recipe.parallelism.pp > 1:
        advice.append(
            Advice(
                "zero-with-pp",
                "with pipeline parallelism only ZeRO stage 1 composes (stage 2/3 would repartition "
                "gradients every micro-batch)",
            )
        )
    micro = recipe.parallelism.micro_batch_size or 1
    if micro % 8 or (shape.hidden and shape.hidden % 8):
        advice.append(
            Advice(
                "multiple-of-8", f"tensor cores want multiples of 8: micro batch {micro}, hidden size {shape.hidden}"
            )
        )
    return advice


def plan(loaded: LoadedRecipe, top: int = 5, global_batch: int | None = None) -> Plan:
    profile, recipe = loaded.profile, loaded.recipe
    if top < 1 or (global_batch is not None and global_batch < 1):
        raise PlanError("top and the global batch must be positive")
    if profile.gpu is None:
        raise PlanError(f"cluster profile '{profile.name}' lacks gpu.memory_gb (and peak_tflops) for planning")
    shape = shape_of(loaded)
    gpu_memory = int(profile.gpu.memory_gb * GIB)
    mixed = recipe.precision != "fp32"
    optimizer = optimizer_kind(recipe.task.trainer.args.get("optim") if recipe.task.trainer else None)
    gpus_per_node = recipe.resources.gpus_per_node
    fused = fused_attention(recipe)

    def estimate_for(layout: Layout) -> MemoryEstimate:
        return estimate(shape, layout, mixed, optimizer, profile.accelerator, gpus_per_node, fused)

    current = Layout.of_recipe(recipe)
    result = Plan(shape, gpu_memory, current, estimate_for(current))
    result.advice = advise(shape, loaded, gpu_memory, estimate_for)
    recipe_global = recipe.parallelism.global_batch_size
    wanted_global = global_batch or recipe_global
    if wanted_global != recipe_global:
        ratio = wanted_global / recipe_global
        result.advice.append(
            Advice(
                "lr-scaling",
                f"global batch {recipe_global} -> {wanted_global}: scale the learning rate "
                f"linearly (x{ratio:.2f}) or by its square root (x{ratio**0.5:.2f})",
            )
        )
    if recipe.task.trainer is not None:
        result.notes.append(
            "the built-in Trainer runner does data parallelism with ZeRO; TP/PP layouts need a user script"
        )
    if shape.family == SIZE_ONLY:
        result.notes.append("only task.model_size is known: activations are not estimated")
    ranked = []
    for layout in candidate_layouts(shape, loaded, wanted_global):
        memory = estimate_for(layout)
        if memory.total > gpu_memory:
            continue
        step, dominant = _cost(shape, layout, wanted_global, loaded)
        tokens = wanted_global * (shape.seq_len or 1) / step
        spare = (gpu_memory - memory.total) / GIB
        ranked.append(RankedLayout(layout, memory, step, tokens, f"{spare:.0f} GiB spare; {dominant}"))

    def complexity(layout: Layout) -> float:
        offloads = (layout.offload_optimizer != "none") + (layout.offload_params != "none")
        return 1 + COMPLEXITY_PENALTY * (layout.zero_stage + offloads)

    ranked.sort(key=lambda r: (r.step_s * complexity(r.layout), r.memory.total))
    result.ranked = ranked[:top]
    return result

"""Per-GPU memory for a layout: model states (weights, gradients, optimizer), activations and
framework overhead, as ZeRO / DP, TP, PP and context parallelism (CP) divide them, and what offload
moves to host RAM. Expert parallelism is not modelled: the model shape has no experts, so its weights
count as dense (and replicated over the expert-parallel ranks).

Model-state bytes per parameter: 4 fp32 weights or 6 under mixed precision, 4 for gradients, 8 for
AdamW, 4 Adafactor, 2 8-bit Adam; for ZeRO, DeepSpeed's own accounting
(16-bit params and grads, fp32 master weights, gradients and optimizer states partitioned by stage).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterkit.estimate.modelsize import ModelShape
from clusterkit.spec.resolved import ResolvedRecipe

GIB = 2**30
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adafactor": 4, "adamw_8bit": 2, "sgd": 4}
# Framework overhead, named so the estimate is honest about its guesses.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)  # CUDA context + cuBLAS/cuDNN workspaces per process
NCCL_BUFFER_BYTES = int(0.5 * GIB)  # NCCL channel buffers once a process group exists
FRAGMENTATION = 0.10  # allocator fragmentation margin on top of what tensors need
HOST_BUFFER_FACTOR = 1.5  # DeepSpeed's estimators' additional_buffer_factor for host memory


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    offload_optimizer: str = "none"
    offload_params: str = "none"
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    # Context parallel: each rank holds 1/cp of every sequence; the weights are replicated over the cp
    # ranks, and ZeRO (DeepSpeed Ulysses, Megatron's distributed optimizer) shards over dp*cp ranks.
    cp: int = 1

    @classmethod
    def of_recipe(cls, recipe: ResolvedRecipe) -> Layout:
        p, trainer = recipe.parallelism, recipe.task.trainer
        checkpointing = bool(trainer.args.get("gradient_checkpointing", False)) if trainer else False
        if p.fsdp is not None:  # FSDP2 keeps what ZeRO-3 keeps, sharded over its shard group
            shard = p.fsdp.shard_size or p.dp
            return cls(
                shard,
                p.tp,
                p.pp,
                3,
                "cpu" if p.fsdp.cpu_offload else "none",
                "cpu" if p.fsdp.cpu_offload else "none",
                p.micro_batch_size,
                p.gradient_accumulation_steps,
                checkpointing or p.fsdp.activation_checkpointing,
                p.cp,
            )
        return cls(
            p.dp,
            p.tp,
            p.pp,
            p.zero_stage,
            p.offload_optimizer,
            p.offload_params,
            p.micro_batch_size,
            p.gradient_accumulation_steps,
            checkpointing,
            p.cp,
        )

    def describe(self) -> str:
        text = (
            f"dp{self.dp} tp{self.tp} pp{self.pp}"
            + (f" cp{self.cp}" if self.cp > 1 else "")
            + f" zero{self.zero_stage}"
        )
        if self.offload_optimizer != "none":
            text += f" off-opt:{self.offload_optimizer}"
        if self.offload_params != "none":
            text += f" off-par:{self.offload_params}"
        text += f" mb{self.micro_batch_size}x{self.gradient_accumulation_steps}"
        return text + (" ckpt" if self.gradient_checkpointing else "")


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int
    host_per_node: int  # states offloaded to CPU RAM, per node

    @property
    def model_states(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.overhead


def optimizer_kind(optim: str | None) -> str:
    """Map a TrainingArguments ``optim`` name onto the state it keeps per parameter."""
    name = (optim or "adamw").lower()
    if "8bit" in name:
        return "adamw_8bit"
    if "adafactor" in name:
        return "adafactor"
    if "sgd" in name:
        return "sgd"
    return "adamw"


def model_state_bytes(
    shape: ModelShape, layout: Layout, mixed_precision: bool, optimizer: str = "adamw"
) -> tuple[int, int, int, int]:
    """(weights, gradients, optimizer, offloaded-to-host) bytes on one GPU."""
    n = shape.params / (layout.tp * layout.pp)
    dp, stage = layout.dp * layout.cp, layout.zero_stage  # the ranks ZeRO shards over
    opt = OPTIMIZER_STATE_BYTES[optimizer]
    largest = shape.largest_layer_params
    offload_opt = layout.offload_optimizer != "none" and stage >= 1
    offload_par = layout.offload_params != "none" and stage == 3
    if stage == 0:
        weights = 6 * n if mixed_precision else 4 * n
        # DDP copies gradients into its communication buckets as well.
        grads = 4 * n * (2 if dp > 1 else 1)
        return int(weights), int(grads), int(opt * n), 0
    # ZeRO: 16-bit (or fp32) working copies, fp32 master weights + gradients + optimizer partitioned.
    work = 2 if mixed_precision else 4
    master = 4 if mixed_precision else 0
    fp32_grads = 4 if mixed_precision else 0
    host = 0.0
    if offload_opt:
        host = (master + fp32_grads + opt) * n / dp
        master_gpu = grad32_gpu = opt_gpu = 0.0
    else:
        master_gpu, grad32_gpu, opt_gpu = master * n / dp, fp32_grads * n / dp, opt * n / dp
    if stage == 3:
        gathered = work * largest  # the biggest module is whole on the GPU while it runs
        weights = (0 if offload_par else work * n / dp) + gathered + master_gpu
        # Stage 3 reduce-scatters gradients straight into the fp32 partition the optimizer reads, so
        # only that partition is counted (DeepSpeed's estimator: 18 bytes per parameter / dp in all).
        grads = (grad32_gpu if mixed_precision else (0 if offload_opt else work * n / dp)) + gathered
        if offload_par:
            host += work * n / dp
    else:
        weights = work * n + master_gpu
        grads_work = work * n if stage == 1 else work * n / dp
        # With the optimizer offloaded the 16-bit gradients are still produced on the GPU, whole
        # (stage 1) or as this rank's partition (stage 2), before they are copied to the host:
        # measured on an H100 (ZeRO-2, world 1), leaving them out planned 0.69x of the peak.
        grads = grads_work + grad32_gpu
    return int(weights), int(grads), int(opt_gpu), int(host)


# Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
# Models" (arXiv:2205.05198), eq. 1-2: per layer s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes with 16-bit
# activations and tensor parallelism t; with full recomputation only each layer's input (2·s·b·h)
# is kept. Fused attention (SDPA / FlashAttention, transformers' default) does not store the a·s²·b
# score matrices; eager attention does: 5 bytes an element under mixed precision (the paper's 5·a·s/h)
# and 4 in fp32 (the fp32 softmax output alone), as measured on an H100 with a 1.1B Llama
# (docs/gpu/2026-11-27-h100.md: without the term, `plan` was 0.61x and 0.72x of the peak).
EAGER_SCORE_BYTES = {True: 5, False: 4}  # by mixed precision


def activation_bytes(shape: ModelShape, layout: Layout, mixed_precision: bool, fused_attention: bool = True) -> int:
    s, b, h, a, t = shape.seq_len / layout.cp, layout.micro_batch_size, shape.hidden, shape.heads, layout.tp
    scale = 1 if mixed_precision else 2  # fp32 activations take twice the bytes
    layers_here = shape.layers / layout.pp
    scores = 0 if fused_attention else EAGER_SCORE_BYTES[mixed_precision] * a * s / (h * t)
    per_layer_full = s * b * h * ((10 + 24 / t) * scale + scores)
    if layout.gradient_checkpointing:
        per_stage = 2 * s * b * h * scale * layers_here + per_layer_full  # inputs + one layer recomputed
    else:
        per_stage = per_layer_full * layers_here
    in_flight = min(layout.pp, layout.gradient_accumulation_steps) if layout.pp > 1 else 1  # 1F1B warm-up
    logits = 2 * 4 * s * b * shape.vocab / t  # fp32 logits and their gradient, on the last stage
    return int(per_stage * in_flight + logits)


def fused_attention(recipe: ResolvedRecipe) -> bool:
    """Whether the recipe's model runs a fused attention kernel (only ``attention: eager`` does not)."""
    trainer = recipe.task.trainer
    return not (trainer is not None and trainer.model.attention == "eager")


def estimate(
    shape: ModelShape,
    layout: Layout,
    mixed_precision: bool,
    optimizer: str,
    accelerator: str,
    gpus_per_node: int,
    fused_attention: bool = True,
) -> MemoryEstimate:
    weights, grads, opt, host_per_gpu = model_state_bytes(shape, layout, mixed_precision, optimizer)
    activations = activation_bytes(shape, layout, mixed_precision, fused_attention)
    overhead = int(FRAGMENTATION * (weights + grads + opt + activations))
    if accelerator == "gpu":
        world = layout.dp * layout.tp * layout.pp * layout.cp
        overhead += CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if world > 1 else 0)
    return MemoryEstimate(
        weights, grads, opt, activations, overhead, int(host_per_gpu * gpus_per_node * HOST_BUFFER_FACTOR)
    )

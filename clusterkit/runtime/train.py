"""The built-in runner: every rank of a ``task.trainer`` job runs :func:`main` under torchrun or
the DeepSpeed launcher. It maps the resolved recipe to ``TrainingArguments``, trains with HF
``Trainer``, resumes from the newest complete, intact checkpoint in the run directory (or the run
named by resume_from), writes metrics as JSON lines from rank 0, and writes one
``ranks/rank-<R>.json`` per rank that proves the layout (real world size, the batches the rank saw,
a checksum of its final parameters)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator, set_seed

from clusterkit.runtime.applied_layout import AppliedLayout
from clusterkit.runtime.checkpoints import CheckpointPublisher, prepare_own_dir, resume_point
from clusterkit.runtime.data import build_dataset
from clusterkit.runtime.model import attention_implementation, build_model, build_tokenizer
from clusterkit.runtime.preemption import PreemptionHandler
from clusterkit.runtime.profiling import StepProfiler
from clusterkit.runtime.rank_exit import fsync_tree, write_durably
from clusterkit.runtime.step_times import GpuSampler, StepTimes
from clusterkit.runtime.tracking import start_tracking
from clusterkit.spec import layout as run_layout
from clusterkit.spec.fsdp_config import fsdp_training_arguments, hsdp_sizes
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import TrainerTask
from clusterkit.spec.resolved import ResolvedRecipe, decode_job_file
from clusterkit.spec.watchdog import seconds

# How many of a rank's first batches are fingerprinted in rank-<R>.json.
FINGERPRINTED_BATCHES = 4


class LayoutError(RuntimeError):
    """The processes the launcher started do not form the world the recipe asked for."""


def trainer_task(recipe: ResolvedRecipe) -> TrainerTask:
    """What the built-in runner trains; a job of task.script never launches it."""
    if recipe.task.trainer is None:
        raise LayoutError(f"recipe '{recipe.name}' runs task.script, not the built-in runner (task.trainer)")
    return recipe.task.trainer


def training_settings(recipe: ResolvedRecipe, profile: ClusterProfile, run_dir: Path) -> dict[str, Any]:
    """TrainingArguments keywords from the recipe. The layout keys come from the recipe; the user's
    task.trainer.args fill or override the rest; GPU defaults (bf16, fused AdamW and attention, TF32) apply on a GPU and the rest still runs on CPU."""
    on_gpu = profile.accelerator == "gpu"
    cpus_per_rank = max(1, recipe.resources.cpus_per_task // recipe.ranks_per_node)
    settings: dict[str, Any] = {
        "logging_steps": 10,
        "save_steps": 500,
        "seed": 42,
        "report_to": recipe.tracking.tracker,  # the Trainer's own integration; the job's env names the run
        "disable_tqdm": True,  # progress goes to metrics.jsonl; tqdm bars garble per-node logs
        "optim": "adamw_torch_fused" if on_gpu else "adamw_torch",
        "dataloader_num_workers": min(4, cpus_per_rank - 1) if on_gpu else 0,
        "dataloader_pin_memory": on_gpu,
        "ddp_find_unused_parameters": False,  # True costs an extra graph traversal per step
    }
    if recipe.tracking.run_id is not None:
        settings["run_name"] = recipe.tracking.run_id
    settings.update(trainer_task(recipe).args)
    settings.update(
        output_dir=str(run_dir / run_layout.CHECKPOINTS_DIR),
        per_device_train_batch_size=recipe.parallelism.micro_batch_size,
        gradient_accumulation_steps=recipe.parallelism.gradient_accumulation_steps,
        bf16=recipe.precision == "bf16",
        fp16=recipe.precision == "fp16",
        # Without use_cpu on a CPU-only node, DDP silently trains every rank alone (world size 1).
        use_cpu=not on_gpu,
    )
    if not on_gpu:
        settings["ddp_backend"] = "gloo"
    if recipe.collective_timeout is not None:  # also the env's CLUSTERKIT_COLLECTIVE_TIMEOUT_S (spec.network)
        settings["ddp_timeout"] = seconds(recipe.collective_timeout)
    ds_config = run_dir / run_layout.DEEPSPEED_CONFIG
    if recipe.uses_deepspeed:
        settings["deepspeed"] = str(ds_config)
    settings.update(fsdp_training_arguments(recipe))
    if hsdp := hsdp_sizes(recipe):
        from accelerate.parallelism_config import ParallelismConfig

        settings["parallelism_config"] = ParallelismConfig(dp_replicate_size=hsdp[0], dp_shard_size=hsdp[1])
    return settings


class MetricsWriter(TrainerCallback):
    """Rank 0 appends one JSON line per log step: step, loss, samples/s, tokens/s, world size; and
    touches the supervisor's heartbeat file at every step."""

    def __init__(self, path: Path, global_batch: int, seq_len: int, world_size: int):
        self.path = path
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.world_size = world_size
        self._last: tuple[float, int] | None = None

    def record(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())  # status and follow read it; the rank may end with os._exit

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._last = (time.time(), state.global_step)
            self.record(
                {
                    "event": "start",
                    "time": time.time(),
                    "step": state.global_step,
                    "max_steps": state.max_steps,
                    "world_size": self.world_size,
                    "global_batch_size": self.global_batch,
                }
            )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        now = time.time()
        last_time, last_step = self._last or (now, state.global_step)
        steps = state.global_step - last_step
        samples_per_s = steps * self.global_batch / (now - last_time) if steps and now > last_time else None
        self._last = (now, state.global_step)
        self.record(
            {
                "event": "log",
                "time": now,
                "step": state.global_step,
                "max_steps": state.max_steps,
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "epoch": logs.get("epoch"),
                "samples_per_s": samples_per_s,
                "tokens_per_s": samples_per_s * self.seq_len if samples_per_s else None,
                "world_size": self.world_size,
            }
        )

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.record({"event": "end", "time": time.time(), "step": state.global_step, "world_size": self.world_size})

    def on_step_end(self, args, state, control, **kwargs):
        # The watchdog's sign of progress at every step (metrics lines come only every logging_steps).
        heartbeat = os.environ.get("CLUSTERKIT_HEARTBEAT")
        if heartbeat and state.is_world_process_zero:
            Path(heartbeat).touch()


class FingerprintingTrainer(Trainer):
    """Records a hash of each of the rank's first batches (in the main process, whatever the
    number of data-loader workers) so a run can prove that ranks saw different data."""

    def __init__(self, *args: Any, step_times: StepTimes | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.batch_fingerprints: list[str] = []
        self.step_times = step_times

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.step_times is not None:  # the rank's data wait (runtime/step_times.py says why here)
            epoch_iterator = self.step_times.timed(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def training_step(self, model, inputs, *args, **kwargs):
        if len(self.batch_fingerprints) < FINGERPRINTED_BATCHES:
            ids = inputs["input_ids"].detach().to("cpu").contiguous()
            self.batch_fingerprints.append(hashlib.sha1(ids.numpy().tobytes()).hexdigest()[:16])
        return super().training_step(model, inputs, *args, **kwargs)


def _hub_facts(model: Any) -> dict[str, Any]:
    """Where the model came from and the hub settings this rank's libraries read (an offline profile's
    HF_HOME and HF_HUB_OFFLINE, as they arrived through env.sh)."""
    from huggingface_hub import constants

    return {
        "model": model.config.name_or_path,
        "offline": constants.HF_HUB_OFFLINE,
        "cache_dir": constants.HF_HUB_CACHE,
        "hf_home": os.environ.get("HF_HOME"),
    }


def _parameter_checksum(model: torch.nn.Module, zero_stage: int) -> float:
    """Sum of all parameters in float64; under ZeRO-3 the partitions are gathered first (every rank
    must call this, as the gather is a collective)."""
    params = list(model.parameters())
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(params), torch.no_grad():
            return float(sum(p.detach().double().sum().item() for p in params))
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in params))


def _deepspeed_engine_facts(trainer: Trainer) -> dict[str, Any]:
    engine = getattr(trainer, "model_wrapped", None)
    if engine is None or not hasattr(engine, "zero_optimization_stage"):
        return {"zero_stage": 0, "optimizer": type(trainer.optimizer).__name__ if trainer.optimizer else None}

    def device(offload: Any) -> str:
        return str(getattr(offload, "device", None) or "none").split(".")[-1].lower()

    return {
        "zero_stage": engine.zero_optimization_stage(),
        "optimizer": type(engine.optimizer).__name__,
        "offload_optimizer": device(engine.zero_offload_optimizer()),
        "offload_params": device(engine.zero_offload_param()),
    }


def _check_world(args: TrainingArguments, expected: int) -> None:
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != expected:
        raise LayoutError(
            f"the launcher started {launched} ranks but the recipe lays out {expected} (nodes x gpus_per_node)"
        )
    if args.world_size != launched:
        raise LayoutError(
            f"the Trainer sees world size {args.world_size} but {launched} ranks were launched: every rank "
            "would train alone on the same data (on CPU, TrainingArguments needs use_cpu=True)"
        )


def save_model(trainer: Trainer, out_dir: Path, is_rank_zero: bool) -> None:
    """The final model, loadable with from_pretrained. Where every rank holds a shard of each layer
    the Trainer's save_model writes no weights: under AutoTP, and under FSDP with sharded checkpoints
    (it saves only a FULL_STATE_DICT; first seen on a GPU, bench/gpu). The full state dict is gathered
    (a collective: every rank calls it) and rank 0 saves it."""
    engine = trainer.model_wrapped
    if getattr(engine, "autotp_size", lambda: 1)() > 1:
        state = engine._consolidated_16bit_state_dict()
    elif trainer.is_fsdp_enabled:
        state = trainer.accelerator.get_state_dict(trainer.model)
    else:
        trainer.save_model(str(out_dir))
        return
    if is_rank_zero:
        trainer.accelerator.unwrap_model(trainer.model).save_pretrained(str(out_dir), state_dict=state)


def main(job_file: Path) -> int:
    code = _train(job_file)
    # Tear the process group down before leaving (see rank_exit.finish for how the rank then ends).
    # Only on a normal return: after an error a peer may still be inside a collective.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return code


def _train(job_file: Path) -> int:
    job = decode_job_file(job_file.read_bytes())
    recipe, profile = job.recipe, job.profile
    run_dir = job_file.parent
    trainer_spec = trainer_task(recipe)
    base_dir = Path.cwd()
    settings = training_settings(recipe, profile, run_dir)
    # Rotation is clusterkit's, after a newer checkpoint is complete: the Trainer's own deletes the
    # previous checkpoint before the new one is marked complete, leaving a moment with none.
    keep_checkpoints = settings.pop("save_total_limit", None)
    if profile.accelerator == "gpu" and "tf32" not in settings and torch.cuda.get_device_capability() >= (8, 0):
        settings["tf32"] = True  # TF32 matmuls on Ampere and later, where they exist
    args = TrainingArguments(**settings)
    subset = recipe.deepspeed.include or recipe.deepspeed.exclude
    # With DeepSpeed include/exclude only the launcher knows how many ranks remain.
    expected_world = int(os.environ.get("WORLD_SIZE", "1")) if subset else recipe.world_size
    _check_world(args, expected_world)
    start_tracking(recipe.tracking.tracker, args.process_index == 0)
    if args.deepspeed:
        import deepspeed

        # ZeRO-3 partitions parameters while the model is built (zero.Init), which asks deepspeed.comm
        # for the world size: it must be initialised first, or it reports 1 and the batch check fails.
        deepspeed.init_distributed(dist_backend="gloo" if profile.accelerator == "cpu" else "nccl")

    # Seeded before the model is built, on every rank: the weights a model is initialised with must
    # be the same everywhere (AutoTP shards each rank's own copy; nothing broadcasts them first) and
    # the same in every run of the recipe (the Trainer seeds only once the model exists).
    set_seed(args.seed)
    on_gpu = profile.accelerator == "gpu"
    attention = trainer_spec.model.attention or attention_implementation(
        on_gpu, importlib.util.find_spec("flash_attn") is not None
    )
    model = build_model(trainer_spec.model, base_dir, attention)
    tokenizer = build_tokenizer(trainer_spec.model, base_dir)
    dataset = build_dataset(trainer_spec.dataset, tokenizer, model.config.vocab_size, args.seed, base_dir)
    if args.gradient_checkpointing:
        model.config.use_cache = False  # the KV cache is useless in training and conflicts with checkpointing

    # Samples per optimizer step from the ranks that really run (DeepSpeed include/exclude may drop
    # some); tensor-parallel peers share their batches, so it is the data-parallel ranks that count.
    global_batch = (
        args.per_device_train_batch_size * args.gradient_accumulation_steps * (args.world_size // recipe.parallelism.tp)
    )
    metrics = MetricsWriter(run_dir / run_layout.METRICS, global_batch, trainer_spec.dataset.seq_len, args.world_size)
    preempt = PreemptionHandler(run_dir, recipe.preemption.handled_signal)
    layout = AppliedLayout(recipe, args.world_size)
    publisher = CheckpointPublisher(keep_checkpoints, record=metrics.record)
    gpu = GpuSampler.open(torch.cuda.current_device()) if on_gpu else None
    step_times = StepTimes(run_dir / run_layout.step_times(args.process_index), gpu)
    callbacks = [layout, metrics, publisher, preempt, step_times]
    if recipe.profile is not None:
        callbacks.append(StepProfiler(recipe.profile, args.process_index, args.world_size, run_dir))
    trainer = FingerprintingTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=default_data_collator,
        callbacks=callbacks,
        step_times=step_times,
    )
    if recipe.parallelism.tp > 1:  # each checkpoint also gets the full weights: zero_to_fp32 cannot join TP shards
        publisher.consolidate = lambda checkpoint: save_model(trainer, checkpoint, args.process_index == 0)
    own_checkpoints = Path(args.output_dir)
    if args.process_index == 0:
        prepare_own_dir(own_checkpoints)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    found = resume_point(own_checkpoints, recipe.resume_from, report=args.process_index == 0)
    checkpoint = str(found) if found else None
    if checkpoint and args.process_index == 0:
        print(f"clusterkit: resuming from {checkpoint}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    if preempt.preempted:
        if args.process_index == 0:
            metrics.record({"event": "preempted", "time": time.time(), "step": trainer.state.global_step})
        return preempt.finish(args.process_index == 0)
    save_model(trainer, run_dir / run_layout.MODEL_DIR, args.process_index == 0)
    if args.should_save:
        fsync_tree(run_dir / run_layout.MODEL_DIR)

    record_path = run_dir / run_layout.rank_record(args.process_index)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    engine_facts = _deepspeed_engine_facts(trainer)
    rank_record = {
        **engine_facts,
        "rank": args.process_index,
        "local_rank": args.local_process_index,
        "world_size": args.world_size,
        "dist_world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "host": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "batch_fingerprints": trainer.batch_fingerprints,
        "parameter_checksum": _parameter_checksum(trainer.model, engine_facts["zero_stage"]),
        "resumed_from": checkpoint,
        "global_step": trainer.state.global_step,
        "hub": _hub_facts(trainer.model),
        **layout.facts,
    }
    write_durably(record_path, json.dumps(rank_record, indent=2) + "\n")
    return 0

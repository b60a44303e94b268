"""Layout checks and derivations: world size, TP inside a node, batch arithmetic, ZeRO with PP,
and the warnings ops teams want to see before a job is queued; every rule module's findings
gathered in one pass (the model config's in :mod:`clusterkit.load.model_checks`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec

from clusterkit.errors import Finding, RecipeError
from clusterkit.load import (
    accelerate_checks,
    component_checks,
    job_checks,
    launch_checks,
    model_checks,
    parallel_checks,
    profile_checks,
    ray_checks,
    sbatch_checks,
    step_checks,
    task_checks,
)
from clusterkit.load.yaml_source import KeyPath, SourceMap
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError, read_bounded
from clusterkit.spec.deepspeed_config import BATCH_KEYS, base_config, deepspeed_config, overridden_keys
from clusterkit.spec.network import DEBUG_ENV
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import Parallelism, Recipe, process_model_of
from clusterkit.spec.resolved import (
    ResolvedParallelism,
    ResolvedRecipe,
    ResolvedResources,
    resolve,
    resolve_resources,
    resolved_parallelism,
)


def read_deepspeed_overrides(recipe: Recipe, source: SourceMap) -> Recipe:
    """Replace a deepspeed.config file path (absolute by now) by its JSON content, so the resolved
    recipe holds it."""
    config = recipe.deepspeed.config
    if not isinstance(config, str):
        return recipe
    key = ("deepspeed", "config")
    path = Path(config)
    try:
        loaded = json.loads(read_bounded(path, CONFIG_LIMIT, "a DeepSpeed config"))
    except (OSError, ValueError, InputFileError) as exc:
        raise RecipeError(Finding(source.locate(key), key, f"cannot read DeepSpeed config {path}: {exc}")) from None
    if not isinstance(loaded, dict):
        raise RecipeError(Finding(source.locate(key), key, f"{path} is not a JSON object"))
    return msgspec.structs.replace(recipe, deepspeed=msgspec.structs.replace(recipe.deepspeed, config=loaded))


class _Findings:
    def __init__(self, source: SourceMap, profile_source: SourceMap):
        self.items: list[Finding] = []
        self._source = source
        self._profile_source = profile_source

    def error(self, key: KeyPath, message: str) -> None:
        self.items.append(Finding(self._source.locate(key), key, message))

    def warn(self, key: KeyPath, message: str) -> None:
        self.items.append(Finding(self._source.locate(key), key, message, "warning"))

    def profile_error(self, key: KeyPath, message: str) -> None:
        self.items.append(Finding(self._profile_source.locate(key), key, message))

    def error_count(self) -> int:
        return sum(f.severity == "error" for f in self.items)


def resolve_and_check(
    recipe: Recipe,
    profile: ClusterProfile,
    source: SourceMap,
    profile_source: SourceMap,
    model_config: dict[str, Any] | None,
) -> tuple[ResolvedRecipe | None, list[Finding]]:
    """Fill the profile's defaults, derive dp and the batch sizes, then run every layout check.
    Returns the resolved recipe (none when the layout does not add up, an error then says why) and
    all findings (errors and warnings), so one pass reports every problem at once."""
    found = _Findings(source, profile_source)
    task_checks.check_task(recipe, found.error, found.warn)
    parallel_checks.check_trainer_parallelism(recipe, model_config, model_checks.model_config_key(recipe), found.error)
    process_model = process_model_of(recipe)
    resources = resolve_resources(recipe.resources, profile, process_model)
    parallel_checks.check_fsdp(recipe, profile, resources.nodes * resources.gpus_per_node, found.error)
    parallelism = _resolve_parallelism(recipe.parallelism, resources, found)
    # What computes with dp, micro batch and accumulation (DeepSpeed batch keys, the memory
    # estimate) runs on the resolved recipe, so only when the layout adds up; the other checks
    # read what the recipe wrote.
    resolved = None if parallelism is None else resolve(recipe, profile, resources, parallelism)
    _check_layout(recipe, resources, profile, found)
    _check_zero(recipe, profile, found)
    if resolved is not None:
        _check_deepspeed(resolved, profile, found)
    if model_config is not None and model_checks.check_model_values(recipe, model_config, found.error):
        model_checks.check_model_shape(recipe, model_config, found.error, found.warn)
        if resolved is not None:
            resolved = _fit_memory(resolved, profile, model_config, found)
    _check_env(recipe, found)
    job_checks.check_env_names(recipe, profile, found.error, found.warn, found.profile_error)
    job_checks.check_secrets(recipe, found.error, found.warn)
    job_checks.check_notify(recipe, found.error, found.warn)
    job_checks.check_runs_dirs(recipe, profile, found.error, found.profile_error)
    sbatch_checks.check_extra_sbatch(recipe, resources, found.error, found.warn)
    job_checks.check_drops(recipe, profile, found.error)
    job_checks.check_array(recipe, found.error)
    job_checks.check_lifecycle(recipe, profile, found.error, found.warn)
    job_checks.check_spares(recipe, found.error)
    job_checks.check_tracking(recipe, profile, found.error)
    profile_checks.check_profile(recipe, profile, resources.nodes * resources.gpus_per_node, found.error)
    launch_checks.check_srun(recipe, found.error, found.warn)
    launch_checks.check_process_model(recipe, profile, found.error, found.profile_error)
    launch_checks.check_task_gpu_bind(recipe, profile, found.error, found.profile_error)
    launch_checks.check_container(recipe, profile, found.error, found.profile_error, found.warn)
    launch_checks.check_service(recipe, found.error)
    component_checks.check_components(recipe, profile, found.error, found.warn, found.profile_error)
    launch_checks.check_launcher(recipe, found.error)
    ray_checks.check_ray(recipe, profile, found.error, found.profile_error)
    if resolved is not None:
        accelerate_checks.check_accelerate_config(resolved, found.error)
    launch_checks.check_runtime_values(recipe, profile, found.error, found.profile_error)
    launch_checks.check_cpus(resources, profile, process_model, found.error)
    step_checks.check_steps(recipe, profile, found.error, found.warn)
    return resolved, found.items


def _resolve_parallelism(p: Parallelism, resources: ResolvedResources, found: _Findings) -> ResolvedParallelism | None:
    """dp and the batch sizes; none when they do not add up (the errors say why)."""
    world = resources.nodes * resources.gpus_per_node
    # Written as the recipe has them: "tp*pp" unless cp is used, so the common message stays short.
    names, model = ("tp*pp*cp", p.tp * p.pp * p.cp) if p.cp > 1 else ("tp*pp", p.tp * p.pp)
    if p.dp == "auto":
        if world % model:
            found.error(
                ("parallelism", "tp"), f"{names} = {model} does not divide the {world} GPUs (nodes*gpus_per_node)"
            )
            return None
        dp = world // model
    else:
        dp = p.dp
        if dp * model != world:
            values = f"{dp}*{p.tp}*{p.pp}" + (f"*{p.cp}" if p.cp > 1 else "")
            found.error(
                ("parallelism",),
                f"dp*{names} = {values} = {dp * model}, but nodes*gpus_per_node = "
                f"{resources.nodes}*{resources.gpus_per_node} = {world}",
            )
    if dp % p.ep:
        found.error(
            ("parallelism", "ep"), f"ep={p.ep} must divide dp={dp}: the experts are spread over the data-parallel ranks"
        )
    # The batch sizes are checked even when dp is wrong, so both mistakes show in one pass.
    batch = _batch_sizes(p, dp, found)
    if batch is None or dp * model != world or dp % p.ep:
        return None
    return resolved_parallelism(p, dp, *batch)


def _batch_sizes(p: Parallelism, dp: int, found: _Findings) -> tuple[int, int, int] | None:
    """(micro batch, accumulation steps, global batch), each derived from the others when open."""
    micro, global_, accum = p.micro_batch_size, p.global_batch_size, p.gradient_accumulation_steps
    key = ("parallelism", "global_batch_size")
    if global_ is None:
        micro, accum = micro or 1, accum or 1
        return micro, accum, micro * accum * dp
    if micro and accum:
        if micro * accum * dp != global_:
            found.error(
                key,
                f"global_batch_size {global_} != micro_batch_size*gradient_accumulation_steps*dp"
                f" = {micro}*{accum}*{dp} = {micro * accum * dp}",
            )
            return None
        return micro, accum, global_
    # Derive the missing one of micro / accumulation (micro defaults to 1 when both are open).
    known_name, known = ("gradient_accumulation_steps", accum) if accum else ("micro_batch_size", micro or 1)
    if global_ % (known * dp):
        found.error(key, f"global_batch_size {global_} is not divisible by {known_name}*dp = {known}*{dp}")
        return None
    derived = global_ // (known * dp)
    return (derived, known, global_) if accum else (known, derived, global_)


def _check_layout(recipe: Recipe, resources: ResolvedResources, profile: ClusterProfile, found: _Findings) -> None:
    gpus = resources.gpus_per_node
    p = recipe.parallelism
    if gpus > profile.gpus_per_node:
        found.error(
            ("resources", "gpus_per_node"),
            f"{gpus} asked, but nodes of cluster '{profile.name}' have {profile.gpus_per_node}",
        )
    if p.tp > gpus or gpus % p.tp:
        found.error(
            ("parallelism", "tp"),
            f"tensor parallelism must stay inside one node: tp={p.tp} must divide gpus_per_node={gpus}",
        )
    if profile.accelerator == "cpu" and recipe.precision == "fp16":
        found.error(("precision",), f"fp16 needs a GPU; cluster '{profile.name}' is CPU-only (use fp32 or bf16)")


def _check_zero(recipe: Recipe, profile: ClusterProfile, found: _Findings) -> None:
    p = recipe.parallelism
    if p.zero_stage >= 2 and p.pp > 1:
        found.error(
            ("parallelism", "zero_stage"),
            f"ZeRO stage {p.zero_stage} does not compose with pipeline parallelism (pp={p.pp}); only stage 1 does",
        )
    if p.offload_optimizer != "none" and p.zero_stage == 0:
        found.error(("parallelism", "offload_optimizer"), "optimizer offload needs ZeRO (zero_stage 1, 2 or 3)")
    if p.offload_params != "none" and p.zero_stage != 3:
        found.error(("parallelism", "offload_params"), "parameter offload needs zero_stage: 3")
    if "nvme" in (p.offload_optimizer, p.offload_params) and not profile.nvme_path:
        found.profile_error(("nvme_path",), f"NVMe offload needs nvme_path in cluster profile '{profile.name}'")
    if recipe.deepspeed.enabled is False and (recipe.launcher == "deepspeed" or p.zero_stage > 0):
        why = "the deepspeed launcher" if recipe.launcher == "deepspeed" else f"ZeRO stage {p.zero_stage}"
        found.error(("deepspeed", "enabled"), f"{why} needs DeepSpeed; remove enabled: false")
    elif recipe.launcher == "deepspeed" and p.zero_stage == 0:
        found.warn(
            ("launcher",),
            "the DeepSpeed launcher without ZeRO (zero_stage 0) gives plain data parallelism; torchrun does the same with less set-up",
        )


def _check_deepspeed(recipe: ResolvedRecipe, profile: ClusterProfile, found: _Findings) -> None:
    settings = recipe.deepspeed
    if settings.include and settings.exclude:
        found.error(("deepspeed", "exclude"), "give deepspeed.include or deepspeed.exclude, not both")
    if (settings.include or settings.exclude) and recipe.launcher != "deepspeed":
        found.error(
            ("deepspeed", "include" if settings.include else "exclude"), "include/exclude need launcher: deepspeed"
        )
    if settings.config is None:
        return
    if not recipe.uses_deepspeed:
        found.error(
            ("deepspeed", "config"),
            "deepspeed.enabled is false, so this config is never read; remove one of them"
            if settings.enabled is False
            else "a DeepSpeed config needs DeepSpeed in the job: set deepspeed.enabled: true (a script driving "
            "DeepSpeed at ZeRO-0), zero_stage >= 1 or launcher: deepspeed",
        )
        return
    merged = deepspeed_config(recipe, profile)
    ours = base_config(recipe, profile)
    for batch_key in BATCH_KEYS:
        if merged.get(batch_key) not in (ours[batch_key], "auto"):
            found.error(
                ("deepspeed", "config", batch_key),
                f"{merged[batch_key]} contradicts the recipe's batch layout ({ours[batch_key]}); set it under parallelism",
            )
    for key in overridden_keys(recipe, profile):
        if key not in BATCH_KEYS:
            found.warn(("deepspeed", "config"), f"overrides ds_config key {key} = {json.dumps(_dig(merged, key))}")


def _dig(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def _fit_memory(
    recipe: ResolvedRecipe, profile: ClusterProfile, config: dict[str, Any], found: _Findings
) -> ResolvedRecipe:
    """Warn when the estimated per-GPU memory exceeds the profile's GPUs (closed-form model
    families only: the meta-device fallback would import torch on the validate path). Where
    gradient checkpointing makes a trainer task fit and the recipe leaves it unset, it is turned
    on (a GPU default), said in a warning; ``gradient_checkpointing: false`` keeps it off."""
    from clusterkit.estimate.memory import GIB, Layout, estimate, fused_attention, optimizer_kind
    from clusterkit.estimate.modelsize import CLOSED_FORM_FAMILIES, model_shape

    if profile.gpu is None or config.get("model_type") not in CLOSED_FORM_FAMILIES:
        return recipe
    trainer = recipe.task.trainer
    args = trainer.args if trainer else {}
    shape = model_shape(config, trainer.dataset.seq_len if trainer else None)

    def needed(layout: Layout) -> int:
        return estimate(
            shape,
            layout,
            recipe.precision != "fp32",
            optimizer_kind(args.get("optim")),
            profile.accelerator,
            recipe.resources.gpus_per_node,
            fused_attention(recipe),
        ).total

    layout, available = Layout.of_recipe(recipe), profile.gpu.memory_gb * GIB
    without = needed(layout)
    if without > available and trainer and "gradient_checkpointing" not in args:
        with_it = needed(dataclasses.replace(layout, gradient_checkpointing=True))
        if with_it <= available:
            found.warn(
                ("task", "trainer", "args"),
                f"gradient_checkpointing turned on: an estimated {without / GIB:.1f} GiB "
                f"per GPU without it, {with_it / GIB:.1f} GiB with it, on "
                f"{profile.gpu.memory_gb:g} GiB GPUs (gradient_checkpointing: false keeps it off)",
            )
            task = msgspec.structs.replace(
                recipe.task, trainer=msgspec.structs.replace(trainer, args={**args, "gradient_checkpointing": True})
            )
            return msgspec.structs.replace(recipe, task=task)
    if without > available:
        found.warn(
            ("parallelism",),
            f"estimated {without / GIB:.1f} GiB per GPU does not fit the {profile.gpu.memory_gb:g} GiB "
            "GPUs of this cluster; `clusterkit plan` shows layouts that do",
        )
    return recipe


def _check_env(recipe: Recipe, found: _Findings) -> None:
    key_base: KeyPath
    for key_base, env in ((("network", "env"), recipe.network.env), (("env",), recipe.env)):
        for name, value in sorted(env.items()):
            if str(value).upper() in DEBUG_ENV.get(name, ()) and not recipe.network.debug:
                found.warn(
                    key_base + (name,),
                    f"{name}={value} is a debugging setting that slows jobs or floods logs; use network.debug: true while debugging",
                )

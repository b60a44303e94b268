"""How ``clusterkit plan`` shows its result, and ``--apply``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from clusterkit.estimate.memory import GIB, Layout
from clusterkit.load.loader import BUILTIN_RECIPES_DIR, LoadedRecipe
from clusterkit.load.yaml_source import load_yaml_file
from clusterkit.plan.planner import SIZE_ONLY, Plan

if TYPE_CHECKING:  # rich is imported to print only: `plan --json` and `--apply` need none of it
    from rich.console import Console


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def print_plan(loaded: LoadedRecipe, result: Plan, console: Console | None = None) -> None:
    """Every piece of text is a rich Text, never markup: names and notes come from the recipe."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    shape, memory = result.shape, result.current_memory
    detail = (
        "task.model_size: no layers, heads or sequence known"
        if shape.family == SIZE_ONLY
        else f"{shape.family}, {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, "
        f"vocab {shape.vocab}, sequence {shape.seq_len}"
    )
    console.print(
        Text.assemble(
            (loaded.recipe.name, "bold"), f" on {loaded.profile.name}: {shape.params / 1e9:.3f} B parameters ({detail})"
        )
    )
    table = Table(title=f"per-GPU memory, recipe layout {result.current.describe()}")
    for column in ("weights", "gradients", "optimizer", "activations", "overhead", "total GiB", "GPU GiB", "fits"):
        table.add_column(column, justify="right")
    fits = memory.total <= result.gpu_memory
    table.add_row(
        _gib(memory.weights),
        _gib(memory.gradients),
        _gib(memory.optimizer),
        _gib(memory.activations),
        _gib(memory.overhead),
        _gib(memory.total),
        _gib(result.gpu_memory),
        Text(f"yes, {_gib(result.gpu_memory - memory.total)} spare", style="green")
        if fits
        else Text(f"no, {_gib(memory.total - result.gpu_memory)} short", style="red"),
    )
    console.print(table)
    if memory.host_per_node:
        console.print(Text(f"host RAM per node for offloaded states: {_gib(memory.host_per_node)} GiB"))
    for advice in result.advice:
        console.print(Text(f"- {advice.text}"))
    for note in result.notes:
        console.print(Text(f"note: {note}", style="dim"))
    ranked = Table(title="best layouts (estimated)")
    for column in ("#", "layout", "memory/GPU GiB", "step s", "tokens/s", "why"):
        ranked.add_column(column)
    for index, row in enumerate(result.ranked, 1):
        ranked.add_row(
            str(index),
            row.layout.describe(),
            _gib(row.memory.total),
            f"{row.step_s:.3f}",
            f"{row.tokens_per_s:,.0f}",
            Text(row.why),
        )
    if result.ranked:
        console.print(ranked)
    elif fits:  # a layout the search does not try (an nvme offload, a micro batch over its range)
        console.print(Text("no other layout the plan tries fits on this cluster; the recipe's does"))
    else:
        console.print(Text("no layout fits on this cluster", style="red"))


def apply_layout(loaded: LoadedRecipe, layout: Layout, target: Path | None) -> Path:
    """A copy of the recipe file with the layout written in (comments are not kept). Read as
    validate reads it, so `time: 12:00` and `env: {V: 3.10}` are copied as the text they are."""
    data, _ = load_yaml_file(loaded.path)
    parallelism = data.setdefault("parallelism", {})
    parallelism.update(
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        zero_stage=layout.zero_stage,
        offload_optimizer=layout.offload_optimizer,
        offload_params=layout.offload_params,
        micro_batch_size=layout.micro_batch_size,
        gradient_accumulation_steps=layout.gradient_accumulation_steps,
    )
    parallelism.pop("global_batch_size", None)  # derived from the three above
    trainer = data.get("task", {}).get("trainer")
    if trainer is not None:
        trainer.setdefault("args", {})["gradient_checkpointing"] = layout.gradient_checkpointing
    if layout.zero_stage and data.get("launcher") != "deepspeed":
        data["launcher"] = "deepspeed"
    # Beside the recipe; a shipped recipe named as such (`plan llama-7b-zero3-ib`): here, not in the installed package.
    folder = Path.cwd() if loaded.path.parent == BUILTIN_RECIPES_DIR else loaded.path.parent
    target = target or folder / f"{loaded.path.stem}.planned.yaml"
    target.write_text(
        f"# {loaded.path.name} with the layout chosen by `clusterkit plan`\n" + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )
    return target

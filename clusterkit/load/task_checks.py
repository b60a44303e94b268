"""The task's own rules: exactly one of its forms (the built-in Trainer runner, a script, a
program), a program exec'd as it is, and the Trainer's arguments (each a TrainingArguments field
the recipe does not own, read without importing transformers)."""

from __future__ import annotations

import os
from typing import Any

from clusterkit.load.job_checks import Report
from clusterkit.load.trainer_args import misfit, training_arguments
from clusterkit.spec.layout import DEEPSPEED_CONFIG
from clusterkit.spec.recipe import Recipe

# TrainingArguments the recipe owns: setting them in task.trainer.args would contradict the layout.
RECIPE_OWNED_TRAINER_ARGS = {
    "per_device_train_batch_size": "parallelism.micro_batch_size",
    "gradient_accumulation_steps": "parallelism.gradient_accumulation_steps",
    "deepspeed": f"parallelism.zero_stage (clusterkit renders {DEEPSPEED_CONFIG})",
    "bf16": "precision",
    "fp16": "precision",
    "output_dir": "runs_dir (each run writes into its own run directory)",
    "use_cpu": "the cluster profile's accelerator",
    "local_rank": "the launcher (it sets LOCAL_RANK)",
    "ddp_timeout": "collective_timeout (the runner's ddp_timeout and a script's $CLUSTERKIT_COLLECTIVE_TIMEOUT_S)",
}


def check_task(recipe: Recipe, error: Report, warn: Report) -> None:
    task = recipe.task
    if [task.trainer, task.script, task.program].count(None) != 2:
        error(
            ("task",),
            "give exactly one of task.trainer (built-in HF Trainer runner), task.script and task.program",
        )
        return
    if task.program is not None:
        _check_program(task.program, task.module, error)
        return
    if task.trainer is None:
        if task.script is not None and task.module and not all(p.isidentifier() for p in task.script.split(".")):
            error(("task", "script"), "with module: true, script must be a dotted module name")
        return
    if task.args:
        # Located at the first argument: the recipe's, or the first after `submit RECIPE --`.
        error(
            ("task", "args", 0),
            "task.args (and the arguments after --) go to task.script's program; the built-in Trainer "
            "runner takes none: set TrainingArguments in task.trainer.args (--set task.trainer.args.learning_rate=3e-4)",
        )
    model = task.trainer.model
    if (model.config is None) == (model.pretrained is None):
        error(
            ("task", "trainer", "model"), "give exactly one of model.config (dict or config.json) and model.pretrained"
        )
    dataset = task.trainer.dataset
    if dataset.type != "synthetic" and dataset.path is None:
        error(("task", "trainer", "dataset", "path"), f"a {dataset.type} dataset needs a path")
    for key, owner in sorted(RECIPE_OWNED_TRAINER_ARGS.items()):
        if key in task.trainer.args:
            error(("task", "trainer", "args", key), f"set by clusterkit from {owner}; remove it here")
    _check_training_arguments(task.trainer.args, error, warn)


def _check_program(program: str, module: bool, error: Report) -> None:
    """A program is exec'd as it is: a path (relative to the submit directory) or a name on PATH."""
    if module:
        error(("task", "module"), "task.program is an executable, run as it is; module: true is for task.script")
    if program.startswith("~"):
        error(("task", "program"), f"{program}: no shell runs it, so '~' is not your home; write the full path")
    elif "/" not in program and any(character.isspace() for character in program):
        error(("task", "program"), f"{program!r} is one executable's name; give its arguments in task.args")
    elif "/" not in program and os.path.lexists(program):  # (an unreadable name is simply not here)
        error(
            ("task", "program"),
            f"{program} is looked up on the nodes' PATH, not taken from here; "
            f"for the file in this folder write ./{program}",
        )


def _check_training_arguments(args: dict[str, Any], error: Report, warn: Report) -> None:
    """Every task.trainer.args key must be a TrainingArguments field, and a value its field can
    take (read without importing transformers)."""
    if not args:
        return
    fields = training_arguments()
    if isinstance(fields, str):
        warn(("task", "trainer", "args"), f"unchecked ({fields})")
        return
    for key in sorted(set(args) - set(RECIPE_OWNED_TRAINER_ARGS)):
        if key in fields:
            problem = misfit(args[key], fields[key])
            if problem:
                error(("task", "trainer", "args", key), problem)
            continue
        from difflib import get_close_matches  # an error's suggestion; a valid recipe needs no difflib

        close = get_close_matches(key, sorted(fields), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        error(("task", "trainer", "args", key), f"unknown TrainingArguments key '{key}'{hint}")

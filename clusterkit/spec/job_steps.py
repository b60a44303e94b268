"""A job of several steps (the recipe's ``steps:``, spec.recipe.JobStep): which of them the layout is
for, and the recipe as a step runs (the checks read it; the plan builds each step from its resolved
form, spec.resolved.ResolvedStep). The job's side is clusterkit.supervisor.job_steps."""

from __future__ import annotations

import msgspec

from clusterkit.spec.recipe import AccelerateSettings, JobStep, Recipe


def training_step(recipe: Recipe) -> int:
    """Which of the recipe's steps the layout (and job.json's task) is for: the one of the built-in
    trainer, else the first on every training node."""
    steps = recipe.steps or []
    trainer = [index for index, step in enumerate(steps) if step.task.trainer is not None]
    full = [index for index, step in enumerate(steps) if step.nodes in (None, recipe.resources.nodes)]
    return (trainer or full or [0])[0]


def step_recipe(recipe: Recipe, step: JobStep) -> Recipe:
    """The recipe as one of its steps runs: the step's task, launcher, launcher_args, srun and nodes
    (the recipe's where the step leaves them), its env instead of the recipe's (each step's checks
    read it; the recipe's own are checked once)."""
    launcher = step.launcher or recipe.launcher
    same = launcher == recipe.launcher
    return msgspec.structs.replace(
        recipe,
        task=step.task,
        steps=None,
        launcher=launcher,
        process_model=recipe.process_model if same else None,
        rendezvous=recipe.rendezvous if launcher == "torchrun" else "static",
        accelerate=recipe.accelerate if launcher == "accelerate" else AccelerateSettings(),
        launcher_args=step.launcher_args if step.launcher_args is not None else recipe.launcher_args if same else [],
        srun=step.srun or recipe.srun,
        env=dict(step.env),
        resources=msgspec.structs.replace(recipe.resources, nodes=step.nodes or recipe.resources.nodes),
    )

"""A job of several steps (``steps:``): how its steps relate to the recipe's task (either one, the
training step's task standing for it in every other check), each step's own checks (its task,
launcher, srun options, env and run-time values, as the recipe's are checked, reported at the
step's keys), and what a job of several steps cannot carry yet, refused with why."""

from __future__ import annotations

import dataclasses

import msgspec

from clusterkit.errors import Finding, RecipeError
from clusterkit.load import job_checks, launch_checks, task_checks
from clusterkit.load.job_checks import Report
from clusterkit.load.yaml_source import KeyPath, SourceMap
from clusterkit.spec.job_steps import step_recipe, training_step
from clusterkit.spec.launch_plan import STEP_NAMES
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import EnvEdit, Recipe, process_model_of, tasks_per_node
from clusterkit.spec.runtime_values import placeholders

TRIAL = "trial"
# A step's check reports these keys of the recipe as the step sees them; the step's key holding each.
STEP_KEYS = {
    "task": ("task",),
    "launcher": ("launcher",),
    "process_model": ("launcher",),
    "rendezvous": ("launcher",),
    "launcher_args": ("launcher_args",),
    "srun": ("srun",),
    "env": ("env",),
    "resources": ("nodes",),
}


def with_training_task(recipe: Recipe, source: SourceMap) -> Recipe:
    """With steps: the recipe whose task is its training step's, which the layout checks, the
    estimate and job.json read. Both ``task:`` and ``steps:`` is an error."""
    if recipe.steps is None:
        if not source.written(("task",)):  # a default Task() stands for none written: say what is missing
            raise RecipeError(Finding(source.default, ("task",), "required key 'task' is missing (or give steps:)"))
        return recipe
    if source.written(("task",)):
        # Only task.args (the arguments after `submit RECIPE --`): say where they came from.
        only_args = not any(source.written(("task", key)) for key in ("script", "trainer", "module"))
        at = ("task", "args") if only_args and source.written(("task", "args")) else ("task",)
        raise RecipeError(
            Finding(
                source.locate(at),
                at,
                "give either task: (a job of one step) or steps: (several, each with its own task and task.args), "
                "not both",
            )
        )
    return msgspec.structs.replace(recipe, task=recipe.steps[training_step(recipe)].task)


def relocated(findings: list[Finding], recipe: Recipe, source: SourceMap) -> list[Finding]:
    """With steps, what the checks found in ``task`` is the training step's; each finding once."""
    if recipe.steps is not None:
        at = ("steps", training_step(recipe))
        findings = [
            dataclasses.replace(f, location=source.locate(at + f.key_path), key_path=at + f.key_path)
            if f.key_path[:1] == ("task",)
            else f
            for f in findings
        ]
    return list(dict.fromkeys(findings))


def check_steps(
    recipe: Recipe,
    profile: ClusterProfile,
    error: Report,
    warn: Report,
) -> None:
    """Each step's fields, and the recipe's task check (task_checks) run on each step's task."""
    if recipe.steps is None:
        _check_trial_values(recipe, error)
        return
    _check_combinations(recipe, error)
    training = training_step(recipe)
    names: set[str] = set()
    model = process_model_of(recipe)
    for index, step in enumerate(recipe.steps):
        at: KeyPath = ("steps", index)
        if step.name in names:
            error(at + ("name",), f"another step is named {step.name}: each step's logs are steps/<name>/")
        elif step.name in STEP_NAMES:
            error(at + ("name",), f"{step.name} names a step clusterkit runs itself; choose another name")
        names.add(step.name)
        runs = step_recipe(recipe, step)
        gpus = recipe.resources.gpus_per_node or profile.gpus_per_node
        if tasks_per_node(process_model_of(runs), gpus) > tasks_per_node(model, gpus):
            error(
                at + ("launcher",),
                f"launcher {runs.launcher} starts a task per rank ({process_model_of(runs)}), the recipe's "
                f"{recipe.launcher} one per node ({model}): the allocation's tasks per node are the recipe "
                "launcher's, so a step's launcher may start as many or fewer (give the recipe that launcher)",
            )
        if runs.resources.nodes > recipe.resources.nodes:
            error(at + ("nodes",), f"at most resources.nodes ({recipe.resources.nodes}), the training nodes")
        if step.task.trainer is not None:
            if index != training:
                error(at + ("task", "trainer"), "only one step can run the built-in trainer (job.json holds one task)")
            if step.repeat > 1:
                error(
                    at + ("repeat",),
                    "the built-in trainer continues from the run directory's checkpoints, so each trial would "
                    "resume the one before; repeat a script task instead",
                )
        if index == training and runs.resources.nodes != recipe.resources.nodes:
            trainer = step.task.trainer is not None
            error(
                at + ("nodes",),
                "the built-in trainer trains with the recipe's layout, on all resources.nodes: leave nodes out"
                if trainer
                else "a job of several steps needs a step on all resources.nodes (the layout's)",
            )

        found = _AtStep(at, error, warn)
        if index != training:  # the training step's task is the recipe's, checked as such
            task_checks.check_task(runs, found.error, found.warn)
        launch_checks.check_launcher(runs, found.error)
        launch_checks.check_srun(runs, found.error, found.warn)
        launch_checks.check_runtime_values(runs, profile, found.error, found.ignore)
        job_checks.check_env_names(runs, profile, found.error, found.warn, found.ignore)


@dataclasses.dataclass(frozen=True)
class _AtStep:
    """A check's reports for one step: a key of the recipe as the step sees it, at the step's key;
    any other (the recipe's own, or the profile's) is left to the recipe's checks, which report it once."""

    at: KeyPath
    to_error: Report
    to_warn: Report

    def _step_key(self, key: KeyPath) -> KeyPath | None:
        return self.at + STEP_KEYS[key[0]] + tuple(key[1:]) if key[:1] and key[0] in STEP_KEYS else None

    def error(self, key: KeyPath, message: str) -> None:
        if (step_key := self._step_key(key)) is not None:
            self.to_error(step_key, message)

    def warn(self, key: KeyPath, message: str) -> None:
        if (step_key := self._step_key(key)) is not None:
            self.to_warn(step_key, message)

    def ignore(self, key: KeyPath, message: str) -> None:
        """The profile's findings: the recipe's checks report them."""


def _check_combinations(recipe: Recipe, error: Report) -> None:
    """What a job of several steps cannot carry yet, each with why."""
    if recipe.preemption.max_retries:
        error(
            ("preemption", "max_retries"),
            "a retry is a new job that would run every step again from the first; not with steps: yet (set 0)",
        )
    if recipe.resources.spare_nodes:
        error(
            ("resources", "spare_nodes"),
            "a restart on a spare node starts the launch again, and a job of several steps has one per step; "
            "not with steps: yet",
        )
    if recipe.watchdog is not None:
        error(
            ("watchdog",),
            "the watchdog watches one launch's progress, and a data or evaluation step makes none it can see; "
            "not with steps: yet",
        )
    if recipe.profile is not None:
        error(("profile",), "profile: wraps the launch's built-in runner; not with steps: yet")


def _check_trial_values(recipe: Recipe, error: Report) -> None:
    """``{trial}`` is a step's: in a recipe without steps nothing fills it in."""
    texts: list[tuple[KeyPath, str]] = [(("task", "args", index), arg) for index, arg in enumerate(recipe.task.args)]
    texts += [(("launcher_args", index), arg) for index, arg in enumerate(recipe.launcher_args)]
    for base, env in ((("env",), recipe.env), (("network", "env"), recipe.network.env)):
        for name, value in env.items():
            parts = [value.prepend, value.append] if isinstance(value, EnvEdit) else [value]
            texts += [(base + (name,), text) for text in parts if isinstance(text, str)]
    for key, text in texts:
        if TRIAL in placeholders(text):
            error(key, "{trial} is the trial number of a step with repeat: (steps:); this recipe has no steps")

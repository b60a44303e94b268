"""Rendering: a pure function from a loaded recipe (plus templates) to the job's files.

Nothing here runs a subprocess, reads the clock or writes files (but Jinja's cache of compiled templates,
:mod:`clusterkit.render.template_cache`, which changes no output); :mod:`clusterkit.render.output_dir` is the
separate, all-or-nothing write. ``clusterkit submit`` sends exactly what :func:`render_job` returns.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import msgspec
import yaml

import clusterkit.render.templates
from clusterkit.load.loader import LoadedRecipe
from clusterkit.render.shell import (
    Shell,
    comment,
    extended_value,
    join_words,
    late_expansion,
    one_line,
    quote,
    runtime_text,
)
from clusterkit.render.template_cache import template_cache
from clusterkit.render.template_files import TemplateFiles, checked_directories, checked_script, render_template
from clusterkit.render.tracking_env import tracking_env
from clusterkit.runs import layout as run_layout
from clusterkit.spec.accelerate_config import accelerate_config
from clusterkit.spec.deepspeed_config import deepspeed_config
from clusterkit.spec.network import EnvVar, network_env
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.resolved import JobFile, ResolvedRecipe
from clusterkit.spec.runtime_values import expanded_late
from clusterkit.version import __version__

# Located through the package, not importlib.resources (10 ms of start-up on the render path).
BUILTIN_TEMPLATES = Path(clusterkit.render.templates.__file__).parent
JOB_TEMPLATE = "job.sbatch.j2"
ENV_TEMPLATE = "env.sh.j2"
TASK_SHIM = BUILTIN_TEMPLATES / "task_shim.py"  # copied as it is


@dataclass(frozen=True)
class RenderedJob:
    """Everything a submission consists of, as text. ``files`` maps file name → content."""

    name: str
    files: dict[str, str]
    summary: list[tuple[str, str]] = field(default_factory=list)
    script_name: str = run_layout.JOB_SCRIPT  # the one sbatch is given (a sweep's: its array driver)

    @property
    def script(self) -> str:
        return self.files[self.script_name]


def template_search_path(loaded: LoadedRecipe, extra_dirs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Where templates are looked up, first match wins: ``extra_dirs`` (the CLI passes the
    ``--template-dir`` directories, then those of $CLUSTERKIT_TEMPLATES), the recipe's directory, the
    built-ins. Nothing here reads the environment: the same arguments give the same path."""
    checked_directories(extra_dirs)
    dirs = [*extra_dirs, str(loaded.path.parent), str(BUILTIN_TEMPLATES)]
    return tuple(dict.fromkeys(str(Path(d).resolve()) for d in dirs))


# How templates are read. The compiled code depends on these (the template cache is kept per set).
_SYNTAX = {
    "undefined": jinja2.StrictUndefined,  # a typo in a template fails loudly
    "finalize": quote,  # quote by default; Shell values pass as written
    "keep_trailing_newline": True,
    "trim_blocks": True,
    "lstrip_blocks": True,
    "autoescape": False,
}


@functools.lru_cache(maxsize=8)
def jinja_environment(search_path: tuple[str, ...]) -> jinja2.Environment:
    env = jinja2.Environment(loader=TemplateFiles(list(search_path)), bytecode_cache=template_cache(_SYNTAX), **_SYNTAX)
    env.filters["comment"] = comment
    env.filters["one_line"] = one_line
    env.filters["join_words"] = join_words
    env.filters["raw_shell"] = Shell
    env.filters["in_run_dir"] = in_run_dir
    env.filters["extended_value"] = extended_value
    env.filters["runtime_text"] = runtime_text
    return env


def sbatch_options(loaded: LoadedRecipe) -> list[tuple[str, Any]]:
    """Every #SBATCH option as (flag, value); value None means a bare flag. Sorted by flag."""
    recipe, profile = loaded.recipe, loaded.profile
    r = recipe.resources
    kind = recipe.job_kind
    run_dir = f"{recipe.runs_dir}/{recipe.name}/{run_layout.RUN_DIR_PATTERN[kind]}"  # SLURM fills in the ids
    job_id = run_layout.JOB_ID_PATTERN[kind]
    options: dict[str, Any] = {
        "job-name": recipe.name,
        "nodes": r.nodes + (recipe.service.nodes if recipe.service else 0),  # the training nodes, then the service's
        "ntasks-per-node": recipe.tasks_per_node,  # a launcher per node, or a task per rank
        "cpus-per-task": r.cpus_per_task,
        "output": f"{run_dir}/{run_layout.batch_log(job_id, 'out')}",
        "error": f"{run_dir}/{run_layout.batch_log(job_id, 'err')}",
        "open-mode": "append",  # the batch shell and node 0's srun task share the log
    }
    if profile.accelerator == "gpu" and profile.gpu_request == "gres":
        options["gres"] = f"gpu:{r.gpus_per_node}"
    elif profile.accelerator == "gpu" and profile.gpu_request == "gpus-per-node":
        options["gpus-per-node"] = r.gpus_per_node
    for flag, value in (
        ("mem", r.mem),
        ("time", r.time),
        ("partition", r.partition),
        ("account", r.account),
        ("qos", r.qos),
        ("constraint", r.constraint),
        ("reservation", r.reservation),
    ):
        if value is not None:
            options[flag] = value
    preemption = recipe.preemption
    if preemption.signal is not False:  # the warning signal goes to the batch shell (B:), which passes it to every rank
        options["signal"] = f"B:{preemption.handled_signal}@{preemption.grace_s}"
    requeue = preemption.requeue
    if requeue == "auto":  # requeued on preemption (a retry after a failure is a new job)
        requeue = bool(preemption.max_requeues)
    if isinstance(requeue, bool):  # site: neither flag, the site's JobRequeue decides
        options["requeue" if requeue else "no-requeue"] = None
    if r.time_min is not None:
        options["time-min"] = r.time_min
    if r.wait_all_nodes:
        options["wait-all-nodes"] = 1
    if r.exclusive:
        options["exclusive"] = None
    if recipe.array:
        options["array"] = recipe.array.spec
    for flag, value in r.extra_sbatch.items():
        if value is False:
            options.pop(flag, None)
        else:
            options[flag] = None if value is True else value
    return sorted(options.items())


def srun_options(recipe: ResolvedRecipe, profile: ClusterProfile) -> list[tuple[str, Any]]:
    """The launch step's srun options beyond its layout and logs, as (flag, value); None: a bare flag.
    --cpus-per-task is passed on explicitly: since SLURM 22.05 srun no longer inherits it from the
    allocation, and a node's launcher, ranks and data loaders would share one core. The profile's GPU
    binding goes only to a step whose every task is one rank."""
    s = recipe.srun
    options: list[tuple[str, Any]] = [
        ("kill-on-bad-exit", 1 if s.kill_on_bad_exit else 0),
        ("cpus-per-task", recipe.resources.cpus_per_task),
    ]
    if profile.task_gpu_bind is not None and recipe.process_model != "launcher_per_node":
        options.append(("gpu-bind", profile.task_gpu_bind))
    for flag, value in (("wait", s.wait), ("mpi", s.mpi), ("distribution", s.distribution), ("cpu-bind", s.cpu_bind)):
        if value is not None:
            options.append((flag, value))
    if s.label:
        options.append(("label", None))
    options += [
        (flag, None if value is True else value) for flag, value in sorted(s.extra.items()) if value is not False
    ]
    return options


# The Python package each launcher runs from (launcher python and command need none of their own).
LAUNCHER_PACKAGES = {
    "torchrun": "torch",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
    "mpirun": None,
    "python": None,
    "command": None,
}


def image_needs(recipe: ResolvedRecipe) -> list[str]:
    """The Python packages a container image must hold for this job's launch to start."""
    needs = [LAUNCHER_PACKAGES[recipe.launcher]]
    if recipe.task.trainer is not None or recipe.preflight.enabled:
        needs += ["torch", "transformers", "clusterkit"]  # the built-in runner and the preflight are clusterkit's
    return sorted({need for need in needs if need})


def in_run_dir(name: str) -> Shell:
    """``"$RUN_DIR/<name>"`` for a name from :mod:`clusterkit.runs.layout` (the templates' ``in_run_dir``
    filter): those are plain words, so inside double quotes only an expansion they hold on purpose
    (``$SLURM_NODEID`` in ``layout.node_dir("$SLURM_NODEID")``) is shell."""
    return Shell(f'"$RUN_DIR/{name}"')


def _launch_command(loaded: LoadedRecipe) -> dict[str, Any]:
    task = loaded.recipe.task
    if task.trainer is not None:
        return {"entry": "clusterkit.runtime.runner", "module": True, "args": [in_run_dir(run_layout.JOB_JSON)]}
    entry = task.script
    if loaded.recipe.snapshot is not None:  # the copy in the run directory (an array task's is one folder up)
        up = "/.." if loaded.recipe.job_kind == "array" else ""
        entry = Shell(f'"$RUN_DIR"{up}/' + quote(f"{run_layout.SNAPSHOT_DIR}/{loaded.recipe.snapshot.script}"))
    return {"entry": entry, "module": task.module, "args": [runtime_text(a) for a in task.args]}


def _late_expansion(recipe: ResolvedRecipe, env: list[EnvVar]) -> Shell:
    """What the launch step replaces on each node or task: nothing unless an argument or an env
    value holds ``{node_rank}``, ``{rank}`` or ``{local_rank}`` (spec.runtime_values)."""
    late_env = sorted(
        {
            var.name
            for var in env
            if any(text is not None and expanded_late(text) for text in (var.value, var.prepend, var.append))
        }
    )
    if not late_env and not any(expanded_late(arg) for arg in recipe.task.args):
        return Shell("")
    return late_expansion(late_env, in_task=recipe.process_model == "task_per_gpu")


def render_job(loaded: LoadedRecipe, template_dirs: tuple[str, ...] = ()) -> RenderedJob:
    """Render every file of the job. Deterministic: the same recipe gives byte-identical files."""
    recipe, profile = loaded.recipe, loaded.profile
    env = jinja_environment(template_search_path(loaded, template_dirs))
    resolved = msgspec.to_builtins(recipe)
    files: dict[str, str] = {}
    ds_config_text = None
    accelerate_text = None
    if recipe.launcher == "accelerate" and recipe.accelerate.config is None:
        accelerate_text = yaml.safe_dump(accelerate_config(recipe), sort_keys=True)
        files[run_layout.ACCELERATE_CONFIG] = accelerate_text
    if recipe.uses_deepspeed:
        ds_config_text = json.dumps(deepspeed_config(recipe, profile), indent=2, sort_keys=True) + "\n"
        files[run_layout.DEEPSPEED_CONFIG] = ds_config_text
    job_json = json.dumps(msgspec.to_builtins(JobFile(recipe=recipe, profile=profile)), sort_keys=True) + "\n"
    env_vars = network_env(recipe, profile, tracking_env(recipe))
    # Module names are values (quoted); setup lines are the one place where shell is written on purpose.
    setup = (
        [f"module load {quote(m)}" for m in profile.modules if m not in recipe.drop.modules]
        + [line for line in profile.setup if line not in recipe.drop.setup]
        + list(recipe.setup)
    )
    context = {
        "version": __version__,
        "name": recipe.name,
        "recipe_file": str(loaded.path),
        "profile": profile,
        "recipe": recipe,
        "sbatch": sbatch_options(loaded),
        "run_dir_base": f"{recipe.runs_dir}/{recipe.name}",
        "setup": [Shell(line) for line in setup],
        "srun": srun_options(recipe, profile),
        # Hook lines, like setup lines, are shell written on purpose.
        "pre_launch": [Shell(line) for line in recipe.hooks.pre_launch],
        "post_run": [Shell(line) for line in recipe.hooks.post_run],
        "env": env_vars,
        "late": _late_expansion(recipe, env_vars),
        "network_profile": recipe.network.profile,
        "ds_config_json": ds_config_text,
        "accelerate_config_yaml": accelerate_text,
        "job_json": job_json,
        "launch": _launch_command(loaded),
        "preflight_launch": {
            "entry": "clusterkit.runtime.preflight",
            "module": True,
            "args": [in_run_dir(run_layout.JOB_JSON)],
        },
        "layout": run_layout,  # the run directory's names, for the templates: {{ layout.JOB_JSON | in_run_dir }}
        "job_kind": recipe.job_kind,  # layout.JOB_ID_PATTERN[job_kind] & co.
        "image_needs": image_needs(recipe),
    }
    if recipe.process_model == "batch_launcher":
        files[run_layout.TASK_SHIM] = TASK_SHIM.read_text(encoding="utf-8")
    files[run_layout.ENV_SCRIPT] = render_template(env, ENV_TEMPLATE, context)
    files[run_layout.JOB_SCRIPT] = checked_script(env, JOB_TEMPLATE, render_template(env, JOB_TEMPLATE, context))
    files[run_layout.RESOLVED_RECIPE] = (
        f"# {recipe.name}: resolved by clusterkit {__version__} from {comment(loaded.path)} "
        f"on cluster profile {comment(loaded.profile_path)}\n"
        + yaml.safe_dump(resolved, sort_keys=False, allow_unicode=False, width=100)
    )
    return RenderedJob(name=recipe.name, files=dict(sorted(files.items())), summary=summarize(loaded))


def summarize(loaded: LoadedRecipe) -> list[tuple[str, str]]:
    recipe, profile = loaded.recipe, loaded.profile
    r, p = recipe.resources, recipe.parallelism
    unit = "GPUs" if profile.accelerator == "gpu" else "processes"
    task = f"trainer ({_model_label(loaded)})" if recipe.task.trainer else f"script {recipe.task.script}"
    return [
        ("recipe", f"{recipe.name} ({loaded.path})"),
        ("cluster", f"{profile.name} ({profile.accelerator}, {recipe.network.profile} network)"),
        ("resources", f"{r.nodes} nodes x {r.gpus_per_node} {unit} = {recipe.world_size}"),
        (
            "layout",
            f"dp={p.dp} tp={p.tp} pp={p.pp} zero={p.zero_stage}"
            + (f" offload(opt={p.offload_optimizer}, params={p.offload_params})" if p.zero_stage else ""),
        ),
        (
            "batch",
            f"micro {p.micro_batch_size} x accum {p.gradient_accumulation_steps} x dp {p.dp} = global {p.global_batch_size}",
        ),
        ("launcher", f"{recipe.launcher}, {recipe.precision}"),
        ("task", task),
        ("time", str(r.time or profile.max_time or "partition default")),
    ]


def _model_label(loaded: LoadedRecipe) -> str:
    model = loaded.recipe.task.trainer.model  # type: ignore[union-attr]
    if model.pretrained:
        return model.pretrained
    config = loaded.model_config or {}
    return str(config.get("model_type", "model from config"))

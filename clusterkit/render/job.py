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
import clusterkit.supervisor
from clusterkit.load.loader import LoadedRecipe
from clusterkit.render.shell import Shell, comment, extended_value, join_words, one_line, quote, runtime_text
from clusterkit.render.template_cache import template_cache
from clusterkit.render.template_files import TemplateFiles, checked_directories, checked_script, render_template
from clusterkit.render.tracking_env import tracking_env
from clusterkit.spec import layout as run_layout
from clusterkit.spec.accelerate_config import accelerate_config
from clusterkit.spec.components import header_groups, without_empty_lines
from clusterkit.spec.deepspeed_config import deepspeed_config
from clusterkit.spec.fsdp_config import fsdp_env
from clusterkit.spec.launch_plan import launch_plan
from clusterkit.spec.launchers import accelerate_type
from clusterkit.spec.network import EnvVar, network_env
from clusterkit.spec.resolved import JobFile, ResolvedRecipe
from clusterkit.spec.runtime_values import expanded_late
from clusterkit.spec.sbatch_header import header_options
from clusterkit.version import __version__

# Located through the package, not importlib.resources (10 ms of start-up on the render path).
BUILTIN_TEMPLATES = Path(clusterkit.render.templates.__file__).parent
JOB_TEMPLATE = "job.sbatch.j2"
ENV_TEMPLATE = "env.sh.j2"
SUPERVISOR = Path(clusterkit.supervisor.__file__).parent  # copied into the run directory as it is


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
    return header_options(loaded.recipe, loaded.profile)


def in_run_dir(name: str) -> Shell:
    """``"$RUN_DIR/<name>"`` for a name from :mod:`clusterkit.spec.layout` (the templates' ``in_run_dir``
    filter): those are plain words, so inside double quotes nothing of them is shell."""
    return Shell(f'"$RUN_DIR/{name}"')


def files_dir(recipe: ResolvedRecipe) -> Shell:
    """Where the batch script finds the job's rendered files: its run directory, but for a task of a
    plain job array, whose files are its array's (one up); a sweep point's are its own."""
    plain_array_task = recipe.job_kind == "array" and recipe.array is not None and recipe.array.point is None
    return Shell('"$RUN_DIR/.."' if plain_array_task else '"$RUN_DIR"')


def _late_env(env: list[EnvVar]) -> tuple[str, ...]:
    """The env variables whose values hold a run-time value the node agent fills in."""
    return tuple(
        sorted(
            {
                var.name
                for var in env
                if any(text is not None and expanded_late(text) for text in (var.value, var.prepend, var.append))
            }
        )
    )


@functools.lru_cache(maxsize=1)
def supervisor_files() -> dict[str, str]:
    """The job's supervisor, copied as it is (its own folder in the run directory, with the site
    folder the ranks' Python reads, and enroot's configuration script)."""
    return {
        f"{run_layout.SUPERVISOR_DIR}/{path.relative_to(SUPERVISOR).as_posix()}": path.read_text(encoding="utf-8")
        for path in sorted([*SUPERVISOR.rglob("*.py"), *SUPERVISOR.glob("*.sh")])
    }


def render_job(loaded: LoadedRecipe, template_dirs: tuple[str, ...] = ()) -> RenderedJob:
    """Render every file of the job. Deterministic: the same recipe gives byte-identical files."""
    recipe, profile = loaded.recipe, loaded.profile
    env = jinja_environment(template_search_path(loaded, template_dirs))
    resolved = msgspec.to_builtins(recipe)
    files: dict[str, str] = {}
    if recipe.launcher == "accelerate" and recipe.accelerate.config is None:
        files[run_layout.ACCELERATE_CONFIG] = yaml.safe_dump(accelerate_config(recipe, profile), sort_keys=True)
    # Under accelerate a script's DeepSpeed settings are in accelerate's own config (accelerate_config.yaml).
    if recipe.uses_deepspeed and not (recipe.launcher == "accelerate" and accelerate_type(recipe) == "DEEPSPEED"):
        files[run_layout.DEEPSPEED_CONFIG] = (
            json.dumps(deepspeed_config(recipe, profile), indent=2, sort_keys=True) + "\n"
        )
    files[run_layout.JOB_JSON] = (
        json.dumps(msgspec.to_builtins(JobFile(recipe=recipe, profile=profile)), sort_keys=True) + "\n"
    )
    env_vars = network_env(recipe, profile, tracking_env(recipe) + fsdp_env(recipe))
    plan = launch_plan(
        recipe,
        profile,
        late_env=_late_env(env_vars),
        rank_files=tuple(sorted(files)),
        env_names=tuple(var.name for var in env_vars),
    )
    files[run_layout.LAUNCH_PLAN] = plan.to_json()
    files.update(supervisor_files())  # a copy: the cached dict stays as it is
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
        "hetjob_groups": header_groups(loaded.recipe, loaded.profile),  # spec.components
        "run_dir_base": f"{recipe.runs_dir}/{recipe.name}",
        "setup": [Shell(line) for line in setup],
        "env": env_vars,
        "network_profile": recipe.network.profile,
        "layout": run_layout,  # the run directory's names, for the templates: {{ layout.JOB_JSON | in_run_dir }}
        "job_kind": recipe.job_kind,  # layout.JOB_ID_PATTERN[job_kind] & co.
        "files": files_dir(recipe),
        # An array's secrets file is in its top directory, shared by its tasks.
        "secrets_file": in_run_dir(("../" if recipe.job_kind == "array" else "") + run_layout.SECRETS_FILE),
        "host_python": profile.host_python,
    }
    files[run_layout.ENV_SCRIPT] = render_template(env, ENV_TEMPLATE, context)
    script = render_template(env, JOB_TEMPLATE, context)
    script = without_empty_lines(script) if recipe.components else script  # as SLURM keeps a hetjob's
    files[run_layout.JOB_SCRIPT] = checked_script(env, JOB_TEMPLATE, script)
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
    if recipe.task.program is not None:
        task = f"program {recipe.task.program}"
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

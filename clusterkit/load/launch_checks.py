"""How the job starts its ranks: the process model against the launcher, the launcher's own
arguments, the srun step's options, run-time values and CPUs per task. Each rule reports through
``error``/``warn`` (file, line, key) like the other checks."""

from __future__ import annotations

import os
from pathlib import Path

from msgspec.structs import replace

from clusterkit.load.job_checks import OWNED_ENV, OWNED_ENV_PREFIXES, SHELL_ENV, Report, read_by_programs
from clusterkit.load.slurm_options import SRUN_OPTIONS
from clusterkit.spec import containers
from clusterkit.spec.launchers import LAUNCHERS
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import EnvEdit, Recipe, Srun, process_model_of, tasks_per_node
from clusterkit.spec.resolved import ResolvedResources
from clusterkit.spec.runtime_values import BATCH, NODE, TASK, malformed_env, placeholders, when
from clusterkit.spec.step_options import STEP_OWNED


def check_launcher(recipe: Recipe, error: Report) -> None:
    launcher = recipe.launcher
    if launcher == "mpirun" and recipe.srun != Srun():
        error(
            ("srun",),
            "launcher mpirun starts its daemons with an srun of its own, which takes no srun: options; "
            "give Open MPI's in launcher_args (e.g. [--mca, plm_slurm_args, ...])",
        )
    if launcher == "command" and process_model_of(recipe) == "batch_launcher" and recipe.srun != Srun():
        error(
            ("srun",),
            "launcher command in the batch shell starts the ranks with an srun of its own, which takes no "
            "srun: options; give them on that srun line",
        )
    if launcher == "command" and recipe.task.module:
        error(
            ("task", "module"),
            "launcher: command runs task.script as a program; for a Python module use launcher: python or torchrun",
        )
    if launcher == "accelerate" and recipe.parallelism.zero_stage > 0 and recipe.task.trainer is not None:
        error(
            ("parallelism", "zero_stage"),
            "the built-in runner starts ZeRO itself, not under accelerate's DEEPSPEED type; "
            "use launcher: deepspeed or torchrun for its ZeRO (a script under accelerate gets it)",
        )
    if launcher == "accelerate" and recipe.task.trainer is None and recipe.deepspeed.config is not None:
        error(
            ("deepspeed", "config"),
            "under launcher: accelerate a script's DeepSpeed settings are accelerate's (its "
            "deepspeed_config); give them in accelerate.config (deepspeed_config_file) instead",
        )
    if recipe.accelerate.config is not None and launcher != "accelerate":
        error(("accelerate", "config"), f"accelerate.config is read by launcher: accelerate, not by {launcher}")
    if recipe.rendezvous != "static" and launcher != "torchrun":
        error(("rendezvous",), f"rendezvous: {recipe.rendezvous} is torchrun's; launcher {launcher} has none to choose")
    _check_task_form(recipe, error)
    owned = LAUNCHERS[launcher].owned
    if not owned:
        if recipe.launcher_args:
            where = (
                "python: [python3, ...] for the interpreter's"
                if launcher == "python"
                else f"task.args for the {'program' if launcher == 'srun' else 'command'}'s"
            )
            error(("launcher_args",), f"launcher {launcher} takes no launcher_args; use {where} arguments")
        return
    for index, word in enumerate(recipe.launcher_args):
        if not word.startswith("-"):
            continue  # a flag's value
        name = word.lstrip("-").split("=", 1)[0].replace("_", "-")
        # The launchers' argparse also takes any unambiguous prefix: --nnode is --nnodes.
        field = owned.get(name) or next((owned[flag] for flag in owned if name and flag.startswith(name)), None)
        if field:
            error(
                ("launcher_args", index),
                f"{word.split('=', 1)[0]} is written by clusterkit for {launcher}; set {field} instead",
            )


def _check_task_form(recipe: Recipe, error: Report) -> None:
    """Each launcher starts some of the task's forms (spec.launchers: tasks): task.program, exec'd as
    it is, only one that needs no Python (srun per rank, command per node)."""
    launcher = LAUNCHERS[recipe.launcher]
    task = recipe.task
    form = "program" if task.program is not None else "script" if task.script is not None else "trainer"
    if form in launcher.tasks:
        return
    fitting = " or ".join(name for name, other in LAUNCHERS.items() if form in other.tasks)
    if form == "program":
        error(("task", "program"), f"launcher {launcher.name} runs Python; task.program runs with launcher: {fitting}")
    else:
        what = "the built-in Trainer runner" if form == "trainer" else "task.script"
        error(("launcher",), f"launcher {launcher.name} does not start {what}; use launcher: {fitting}")


def check_process_model(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> None:
    """The launcher decides how ranks start; a process model that says otherwise is refused."""
    model = process_model_of(recipe)
    allowed = LAUNCHERS[recipe.launcher].process_models
    if recipe.process_model is not None and recipe.process_model not in allowed:
        # The launchers whose own model it is first, then those that can also run under it.
        fitting = sorted(name for name, other in LAUNCHERS.items() if other.process_model == recipe.process_model)
        fitting += sorted(name for name, other in LAUNCHERS.items() if recipe.process_model in other.process_models[1:])
        error(
            ("process_model",),
            f"{recipe.process_model} is not how launcher {recipe.launcher} starts ranks "
            f"({' or '.join(allowed)}); for {recipe.process_model} use launcher: {' or '.join(fitting)}",
        )
    preflight = recipe.preflight if isinstance(recipe.preflight, bool) else recipe.preflight.enabled
    if model == "batch_launcher" and preflight:
        error(("preflight",), "the preflight is not supported with process_model: batch_launcher yet")
    if model == "batch_launcher" and profile.container is not None:
        profile_error(
            ("container",),
            f"containers are not supported with process_model: batch_launcher yet (launcher "
            f"{recipe.launcher} starts the ranks outside clusterkit's launch step)",
        )
    if model == "batch_launcher" and (recipe.deepspeed.include or recipe.deepspeed.exclude):
        error(
            ("deepspeed", "include" if recipe.deepspeed.include else "exclude"),
            "include/exclude are not supported with process_model: batch_launcher yet",
        )


def check_task_gpu_bind(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> None:
    """The profile's per-task GPU binding needs GPUs in the job, and hides every GPU but a task's own
    from it: the built-in runner (the Trainer picks cuda:LOCAL_RANK) would ask for a device it cannot
    see, so that pairing is refused rather than left to fail on the GPU nodes."""
    if profile.task_gpu_bind is None:
        return
    if profile.accelerator == "cpu" or profile.gpu_request == "none":
        profile_error(
            ("task_gpu_bind",),
            "binds GPUs to tasks, but this profile requests no GPUs "
            f"(accelerator: {profile.accelerator}, gpu_request: {profile.gpu_request})",
        )
    if "gpu-bind" in recipe.srun.extra:
        error(
            ("srun", "extra", "gpu-bind"),
            f"the cluster profile {profile.name!r} binds GPUs to tasks "
            f"(task_gpu_bind: {profile.task_gpu_bind}); set one or the other",
        )
    if recipe.task.trainer is not None and process_model_of(recipe) != "launcher_per_node":
        error(
            ("task", "trainer"),
            f"the cluster profile {profile.name!r} binds each task to its GPUs "
            f"(task_gpu_bind: {profile.task_gpu_bind}) and the built-in runner selects "
            f"cuda:LOCAL_RANK, which a task would not see; use launcher: torchrun, or a script",
        )


def check_container(
    recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report, warn: Report
) -> None:
    """A recipe's image needs a profile that says how to run containers; a mount that puts another
    host folder over the runs directory inside the container would hide the run from its ranks
    (clusterkit mounts the run directory at its own path; this catches what would cover it)."""
    if recipe.container_image is not None and profile.container is None:
        error(
            ("container_image",),
            f"cluster profile {profile.name!r} runs no container (container: {{runtime, image}}), "
            "so it cannot run this image",
        )
    if recipe.hooks.in_container and profile.container is None:
        error(
            ("hooks", "in_container"),
            f"cluster profile {profile.name!r} runs no container (container: {{runtime, image}}) to run the hooks in",
        )
    if profile.container is None:
        return
    box = profile.container
    image = recipe.container_image or box.image
    refused = containers.refusal(replace(box, image=image), profile)
    if refused is not None:
        key, message = refused
        if key == ("container", "image") and recipe.container_image is not None:
            error(("container_image",), message)
        else:
            profile_error(key, message)
    outside = not containers.RUNTIMES[box.runtime].in_job
    signal = recipe.preemption.signal
    if outside and signal is not False and not LAUNCHERS[recipe.launcher].signal_to_launcher:
        # The node agent passes the preemption signal to the processes that handle it, but it cannot see
        # into a docker container: the client proxies it to the container's first process, the launcher.
        error(
            ("preemption", "signal"),
            f"{box.runtime} passes the preemption signal to the container's first process, launcher "
            f"{recipe.launcher}, which it would end before any rank could save; set preemption.signal: "
            "false, or use launcher: python (each rank in a container of its own gets it)",
        )
    if outside and not recipe.resources.exclusive and profile.accelerator == "gpu":
        warn(
            ("resources", "exclusive"),
            f"{box.runtime}'s containers run outside SLURM's cgroup (its CPU, memory and GPU limits do not "
            "apply, and each sees every GPU of the node): ask for whole nodes (exclusive: true)",
        )
    runs = Path(os.path.abspath(os.path.expanduser(recipe.runs_dir or profile.runs_dir or "./runs")))
    if {",", ":"} & set(str(runs)):
        error(
            ("runs_dir",),
            f"{runs} holds ',' or ':', which the container's mount list cannot carry; "
            "choose a runs directory without them",
        )
    elif box.runtime == "enroot" and any(character.isspace() for character in str(runs)):
        error(("runs_dir",), f"{str(runs)!r} holds a space, which enroot's --mount cannot carry; choose one without")
    for index, entry in enumerate(profile.container.mounts):
        for mount in filter(None, entry.split(",")):  # joined with ',', as both runtimes split their list
            source, _, rest = mount.partition(":")
            target = rest.split(":")[0] or source
            if Path(os.path.normpath(target)) in (runs, *runs.parents) and os.path.normpath(source) != os.path.normpath(
                target
            ):
                profile_error(
                    ("container", "mounts", index),
                    f"{mount} puts {source} over {target} inside the container, "
                    f"which hides the runs directory {runs}; mount it at its own path",
                )


def check_service(recipe: Recipe, error: Report) -> None:
    """The service role needs clusterkit's own launch step (it places training on the other nodes),
    and its address variable must be one the job may set and the recipe does not."""
    service = recipe.service
    if service is None:
        return
    if process_model_of(recipe) == "batch_launcher":
        error(
            ("service",),
            f"a service role is not supported with launcher {recipe.launcher} in the batch shell yet "
            "(it starts ranks on every node of the allocation)",
        )
    name = service.address_env
    if name in OWNED_ENV or any(name.startswith(prefix) for prefix in OWNED_ENV_PREFIXES):
        error(("service", "address_env"), f"{name} is set by clusterkit or SLURM; choose another name")
    elif problem := (f"{name} {SHELL_ENV[name]}" if name in SHELL_ENV else read_by_programs(name)):
        error(
            ("service", "address_env"),
            f"{problem}: the service's address (host:port) in it would change how "
            "the job's programs run; choose a name of your own, such as SERVICE_ADDR",
        )
    if name in recipe.env or name in recipe.network.env:
        error(("service", "address_env"), f"{name} is also set in env; the service's address would replace it")


def check_srun(recipe: Recipe, error: Report, warn: Report) -> None:
    """``srun.extra``: options the launch step's srun is given by clusterkit are refused with the
    field that sets them; an option srun does not document is a warning (a site plugin's)."""
    for flag in sorted(recipe.srun.extra):
        key = ("srun", "extra", flag)
        owned = STEP_OWNED.get(flag) or next((STEP_OWNED[name] for name in STEP_OWNED if name.startswith(flag)), None)
        if owned:
            error(key, f"--{flag} is given to the launch step by clusterkit; set {owned} instead")
        elif flag not in SRUN_OPTIONS:
            warn(key, f"--{flag} is not an srun option SLURM documents; srun will fail unless a site plugin adds it")


def check_cpus(resources: ResolvedResources, profile: ClusterProfile, process_model: str, error: Report) -> None:
    """Every srun task of a node gets cpus_per_task: together they must fit the node, or SLURM
    refuses the job only once it is queued."""
    tasks = tasks_per_node(process_model, resources.gpus_per_node)
    if tasks * resources.cpus_per_task > profile.cpus_per_node:
        per = f" x {tasks} tasks per node ({process_model})" if tasks > 1 else " (one launcher task per node)"
        error(
            ("resources", "cpus_per_task"),
            f"{resources.cpus_per_task} CPUs per srun task{per} needs "
            f"{tasks * resources.cpus_per_task} CPUs per node; cluster profile "
            f"{profile.name!r} has {profile.cpus_per_node}",
        )


def env_texts(value: object) -> list[str]:
    """The text of an env value (both parts of a prepend/append edit), for the checks that read it."""
    if isinstance(value, EnvEdit):
        return [text for text in (value.prepend, value.append) if text is not None]
    return [value] if isinstance(value, str) else []


def check_runtime_values(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> None:
    """Each ``{env:...}`` names a variable; ``{rank}`` and ``{local_rank}`` are known only in a task
    per rank: where a launcher starts the ranks (torchrun, DeepSpeed) nothing of clusterkit's runs in
    them to fill the value in."""

    places = [(error, ("task", "args", index), arg) for index, arg in enumerate(recipe.task.args)]
    # A launcher's own flags: per node ({node_rank}, {hostname}) where it runs once per node.
    places += [(error, ("launcher_args", index), arg) for index, arg in enumerate(recipe.launcher_args)]
    for report, base, env in (
        (error, ("env",), recipe.env),
        (error, ("network", "env"), recipe.network.env),
        (profile_error, ("env",), profile.env),
        (profile_error, ("network_env",), profile.network_env),
    ):
        places += [(report, base + (name,), text) for name, value in env.items() for text in env_texts(value)]
    container_places = _container_texts(recipe, profile, error, profile_error)
    for report, key, text in [*places, *container_places]:
        if (bad := malformed_env(text)) is not None:
            report(key, f"{bad} names no environment variable: write {{env:NAME}}, NAME letters, digits and _")
    # The image check starts the container once, from the batch shell, before any node's step.
    for report, key, text in container_places:
        if later := sorted(name for name in placeholders(text) if when(name) != BATCH):
            report(
                key,
                f"{{{later[0]}}} is known only on a node or in a rank, and the job starts this container from "
                "the batch shell too (its image check): use {job_id}, {run_dir} or {env:NAME} here",
            )
    model = process_model_of(recipe)
    if model == "task_per_gpu":
        return
    late = (TASK,) if model == "launcher_per_node" else (TASK, NODE)  # nothing of clusterkit's runs per node there
    for report, key, text in places:
        if per_rank := sorted(name for name in placeholders(text) if when(name) in late):
            report(
                key,
                f"{{{per_rank[0]}}} is known only in a task per rank (launcher: python or srun); launcher "
                f"{recipe.launcher} starts the ranks itself: read {per_rank[0].upper()} from the environment in the script",
            )


def _container_texts(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> list:
    """The container's values that may hold run-time values (``{env:SCRATCH}/images/x.sqsh``)."""
    box = profile.container
    places: list = [(error, ("container_image",), recipe.container_image)] if recipe.container_image else []
    if box is not None:
        places += [(profile_error, ("container", "image"), box.image)]
        places += [(profile_error, ("container", "mounts", index), mount) for index, mount in enumerate(box.mounts)]
        places += [(profile_error, ("container", "workdir"), box.workdir)] if box.workdir else []
    return places

"""What the job script owns: environment names clusterkit or the launchers set, the runs directory
as SLURM and the shell will read it, notifications, arrays, lifecycle and spares (the #SBATCH
options of extra_sbatch are load.sbatch_checks')."""

from __future__ import annotations

from collections.abc import Callable

from clusterkit.load.yaml_source import KeyPath
from clusterkit.spec.arrays import array_indices
from clusterkit.spec.launchers import BATCH_LAUNCHER
from clusterkit.spec.notify import NOTIFY_EVENTS, mail_type
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import EnvEdit, Recipe, process_model_of
from clusterkit.spec.sbatch_header import MAIL_OPTIONS
from clusterkit.spec.secrets import looks_secret
from clusterkit.spec.timefmt import slurm_time_minutes
from clusterkit.spec.tracking import as_tracking

Report = Callable[[KeyPath, str], None]

_LAUNCHER = "the launcher (torchrun / DeepSpeed), per rank"
# Environment names a recipe or profile may not set, and who sets them. LD_PRELOAD stays allowed:
# preloading tcmalloc/jemalloc is a common, deliberate speed-up.
OWNED_ENV = {
    "RUN_DIR": "the job script (the run directory)",
    "PATH": "the node's shell: replacing PATH hides srun and python; extend it instead: PATH: {prepend: /opt/x/bin}",
    "MASTER_ADDR": "the job script (the allocation's first node)",
    "MASTER_PORT": "the job script (set master_port in the recipe)",
    "RANK": _LAUNCHER,
    "LOCAL_RANK": _LAUNCHER,
    "WORLD_SIZE": _LAUNCHER,
    "LOCAL_WORLD_SIZE": _LAUNCHER,
    "NODE_RANK": _LAUNCHER,
    "GROUP_RANK": _LAUNCHER,
    "CUDA_VISIBLE_DEVICES": "SLURM (the GPUs it allocated to the job)",
}
# The one owned name a recipe's env may still set, where SLURM leaves it alone: a script that orders
# the GPUs itself (gpu_request: none). Where SLURM hands out the GPUs, its gres/gpu plugin overwrites
# this name as each step starts (step_set_env), so a value of the recipe's would never reach the ranks.
GPU_LIST_ENV = "CUDA_VISIBLE_DEVICES"
OWNED_ENV_PREFIXES = {
    "SLURM_": "SLURM (describes the allocation; sbatch options go in resources.extra_sbatch)",
    "CLUSTERKIT_": "clusterkit (its own namespace)",
}
# Names the shell reads as code to run, or as how to run: set in the environment, they would run
# code in every bash of the job (the job script's, each srun task's), past what the job script shows.
SHELL_ENV = {
    "BASH_ENV": "names a file every bash of the job runs first",
    "ENV": "names a file a POSIX shell runs first",
    "SHELLOPTS": "sets the options of every bash of the job (xtrace, errexit...)",
    "BASHOPTS": "sets the shopt options of every bash of the job",
    "PS4": "is expanded, commands and all, for each line a traced bash runs",
    "PROMPT_COMMAND": "is run by bash before each prompt",
}
_SHELL_HINT = "write such shell in setup:, where it runs once, as written, in the job script"


def env_owner(name: str) -> str | None:
    """Who sets environment variable ``name`` in a job, where a recipe may not."""
    return OWNED_ENV.get(name) or next((o for p, o in OWNED_ENV_PREFIXES.items() if name.startswith(p)), None)


def shell_env_problem(name: str) -> str | None:
    """Why ``name`` may not be set from a recipe or profile's env (nor be a secret): the shell runs it."""
    return f"{name} {SHELL_ENV[name]}; {_SHELL_HINT}" if name in SHELL_ENV else None


def read_by_programs(name: str) -> str | None:
    """What reads ``name`` to decide how a program starts (beyond the shell's): a variable clusterkit
    writes a value of its own into (an address) must be none of these."""
    if name.startswith("LD_"):
        return f"{name}: LD_* names are the dynamic loader's, read as every program of the job starts"
    if name.startswith("PYTHON"):
        return f"{name}: PYTHON* names are Python's, read as it starts"
    if name.endswith("PATH"):
        return f"{name} is a search path programs read"
    return None


def check_env_names(
    recipe: Recipe, profile: ClusterProfile, error: Report, warn: Report, profile_error: Report
) -> None:
    for report, base, env in (
        (error, ("env",), recipe.env),
        (error, ("network", "env"), recipe.network.env),
        (profile_error, ("env",), profile.env),
        (profile_error, ("network_env",), profile.network_env),
    ):
        for name in sorted(env):
            if name == "PATH" and isinstance(env[name], EnvEdit):
                continue  # a prepend or append extends the node's PATH: srun and python stay found
            if name == GPU_LIST_ENV and report is error:
                if profile.gpu_request == "none":
                    warn(
                        base + (name,),
                        f"{name} replaces the GPU list SLURM binds to each task: every rank of a node sees this "
                        "same list, in this order",
                    )
                else:
                    error(
                        base + (name,),
                        f"SLURM sets {name} in every step of a cluster whose GPUs it hands out (gpu_request: "
                        f"{profile.gpu_request}), so this value would never reach the ranks; order the GPUs in the script",
                    )
                continue
            owner = env_owner(name)
            if owner is not None:
                report(base + (name,), f"{name} is set by {owner}; remove it here")
            elif problem := shell_env_problem(name):
                report(base + (name,), problem)


def check_secrets(recipe: Recipe, error: Report, warn: Report) -> None:
    """A secret's name is one the job may set, named once; a value under a secret's (or a
    token-like) name in env: is written in plain text into every file of the run, hence the warning."""
    for index, name in enumerate(recipe.secrets):
        owner = env_owner(name)
        if owner is not None:
            error(("secrets", index), f"{name} is set by {owner}; it cannot be a secret")
        elif problem := shell_env_problem(name):
            error(("secrets", index), problem)
        elif name in recipe.secrets[:index]:
            error(("secrets", index), f"{name} is named twice")
    for base, env in ((("env",), recipe.env), (("network", "env"), recipe.network.env)):
        for name in sorted(env):
            if env[name] is not None and (name in recipe.secrets or looks_secret(name)):
                warn(
                    base + (name,),
                    f"{name} looks like a secret, and its value is written in plain text into "
                    f"job.sbatch, env.sh and recipe.resolved.yaml; name it in secrets: instead "
                    f"and set it in the environment you submit from",
                )


def check_notify(recipe: Recipe, error: Report, warn: Report) -> None:
    """Somewhere to send events, and events to send; a webhook's secret is one the job may set (it
    joins secrets:); SLURM's mail options come from notify.email or from extra_sbatch, not both."""
    notify = recipe.notify
    if notify is None:
        return
    if notify.webhook_secret is None and notify.email is None:
        error(("notify",), "nowhere to send the events: give webhook_secret (a secret holding the URL), email, or both")
    if not notify.events:
        error(("notify", "events"), f"no events: name some of {', '.join(NOTIFY_EVENTS)}, or remove notify:")
    for index, event in enumerate(notify.events):
        if event in notify.events[:index]:
            error(("notify", "events", index), f"{event} is named twice")
    name = notify.webhook_secret
    if name is not None and name not in recipe.secrets:  # one named there too is checked there
        owner = env_owner(name)
        if owner is not None:
            error(("notify", "webhook_secret"), f"{name} is set by {owner}; it cannot be a secret")
        elif problem := shell_env_problem(name):
            error(("notify", "webhook_secret"), problem)
    if notify.email is None:
        return
    if notify.events and mail_type(notify) is None:
        warn(
            ("notify", "events"),
            "SLURM mails none of these events (it mails start, failure, restart and completion): "
            "notify.email gets no mail",
        )
    for flag in sorted(recipe.resources.extra_sbatch):
        owned = [option for option in MAIL_OPTIONS if option.startswith(flag)]
        if owned:
            error(
                ("resources", "extra_sbatch", flag),
                f"--{owned[0]} is written from {MAIL_OPTIONS[owned[0]]}; remove it here or remove notify.email",
            )


def runs_dir_problem(runs_dir: str) -> str | None:
    """Why SLURM and the job script would not agree on this runs directory, if they would not."""
    hint = "give a relative path (to where you submit) or an absolute one"
    if "~" in runs_dir:
        return f"'~' is expanded by clusterkit but not in #SBATCH --output, so logs and run would split; {hint}"
    if "%" in runs_dir:
        return f"'%' is a pattern in #SBATCH --output (%j is the job id), so logs would go elsewhere; {hint}"
    if runs_dir.startswith("-"):
        return f"a path starting with '-' reads as an option to mkdir and sbatch; {hint}, e.g. ./{runs_dir}"
    return None


def check_runs_dirs(recipe: Recipe, profile: ClusterProfile, error: Report, profile_error: Report) -> None:
    """Each runs_dir is reported where it is written: the recipe's (as written; unset means the
    profile's applies) and the profile's."""
    if profile.runs_dir and (problem := runs_dir_problem(profile.runs_dir)):
        profile_error(("runs_dir",), problem)
    if recipe.runs_dir and recipe.runs_dir != profile.runs_dir and (problem := runs_dir_problem(recipe.runs_dir)):
        error(("runs_dir",), problem)


def check_drops(recipe: Recipe, profile: ClusterProfile, error: Report) -> None:
    """A dropped module or setup line must be one the profile has: a typo would drop nothing."""
    for kind, dropped, present in (
        ("modules", recipe.drop.modules, profile.modules),
        ("setup", recipe.drop.setup, profile.setup),
    ):
        for index, item in enumerate(dropped):
            if item not in present:
                has = ", ".join(repr(p) for p in present) or "none"
                error(
                    ("drop", kind, index),
                    f"cluster profile {profile.name!r} has no {kind} entry {item!r} (it has: {has})",
                )


def check_array(recipe: Recipe, error: Report) -> None:
    """``resources.array`` runs the same recipe in every task: a script that reads
    ``$SLURM_ARRAY_TASK_ID``. The built-in runner would train the same run N times, so it is refused
    with the way to vary it; a sweep is one array already."""
    spec = recipe.resources.array
    if spec is None:
        return
    key = ("resources", "array")
    try:
        array_indices(spec)
    except ValueError as exc:
        error(key, str(exc))
    if recipe.task.trainer is not None:
        error(
            key,
            "every task would train the same run: vary it with a sweep (a sweep: block, or clusterkit sweep "
            "--grid key=v1,v2), which runs one point per array task",
        )
    if recipe.sweep is not None:
        error(key, "a sweep is one job array already (one task per point); leave resources.array out")


def check_lifecycle(recipe: Recipe, profile: ClusterProfile, error: Report, warn: Report) -> None:
    """The time limit against the site's, requeue and signal settings that contradict each other,
    and a time-min above the time."""
    p, r = recipe.preemption, recipe.resources
    if p.signal == "USR1":
        warn(("preemption", "signal"), "NCCL may claim SIGUSR1; USR2 is safer")
    if r.time is None:
        limit = f" (the partition's maximum, {profile.max_time}, applies)" if profile.max_time else ""
        warn(
            ("resources", "time"), f"no time limit set{limit}; set resources.time so the scheduler can backfill the job"
        )
    elif profile.max_time is not None and slurm_time_minutes(str(r.time)) > slurm_time_minutes(str(profile.max_time)):
        warn(
            ("resources", "time"),
            f"{r.time} is above cluster '{profile.name}' max_time {profile.max_time}; SLURM will reject or cap it",
        )
    if p.requeue is False and p.max_requeues:
        error(
            ("preemption", "requeue"),
            f"false, but max_requeues is {p.max_requeues}: a job that may not be requeued "
            "cannot resume itself after a preemption; set it to 0, or requeue: true",
        )
    if p.max_retries and (recipe.resources.array or recipe.sweep):
        error(
            ("preemption", "max_retries"),
            "a retry is a new job continuing one run; job arrays and sweeps have none yet: set it to 0",
        )
    if p.signal is True:
        error(("preemption", "signal"), "true: name the signal (USR2, TERM, HUP, URG or USR1), or false for none")
    if p.signal is False and p.max_requeues:
        warn(
            ("preemption", "signal"),
            "false: a job stopped at its time limit gets no signal to checkpoint first, so a "
            "requeued run resumes from its last periodic checkpoint",
        )
    if (
        r.time_min is not None
        and r.time is not None
        and slurm_time_minutes(str(r.time_min)) > slurm_time_minutes(str(r.time))
    ):
        error(("resources", "time_min"), f"{r.time_min} is longer than resources.time {r.time}")


def check_tracking(recipe: Recipe, profile: ClusterProfile, error: Report) -> None:
    """An online mlflow run needs a server to report to: without one mlflow writes ./mlruns in the
    job's working directory, where nobody looks (offline: true keeps a file store in the run)."""
    tracking = as_tracking(recipe.tracking)
    if tracking.uri is not None and tracking.tracker != "mlflow":
        error(("tracking", "uri"), f"the tracking server of mlflow; tracker {tracking.tracker} does not use it")
    if (
        tracking.tracker == "mlflow"
        and not tracking.offline
        and tracking.uri is None
        and "MLFLOW_TRACKING_URI" not in {**profile.env, **recipe.env}
    ):
        error(
            ("tracking",),
            "mlflow online needs its server: tracking.uri (or MLFLOW_TRACKING_URI in env), "
            "or offline: true for a file store in the run directory",
        )


def check_spares(recipe: Recipe, error: Report) -> None:
    """Hot spares where a restart on one can work: several nodes, a launch clusterkit starts on
    each node (not a batch launcher, which starts its ranks from the allocation itself), and no
    more restarts than spares."""
    spares, restarts = recipe.resources.spare_nodes, recipe.preemption.max_restarts
    if not spares:
        if restarts:
            error(("preemption", "max_restarts"), "restarts happen on spare nodes: set resources.spare_nodes too")
        return
    if recipe.resources.nodes == 1:
        error(
            ("resources", "spare_nodes"),
            "a single-node job has no node to replace while the others train: leave spare_nodes out "
            "and let preemption.max_retries retry it as a new job",
        )
    if process_model_of(recipe) == BATCH_LAUNCHER:
        error(
            ("resources", "spare_nodes"),
            f"launcher {recipe.launcher} starts its ranks from the batch host over the whole allocation: "
            "clusterkit cannot move them to a spare (use a launcher started on each node, e.g. torchrun)",
        )
    if restarts is not None and restarts > spares:
        error(
            ("preemption", "max_restarts"),
            f"{restarts} restarts, {spares} spare node{'s' if spares > 1 else ''}: each restart uses one; "
            f"at most {spares}",
        )

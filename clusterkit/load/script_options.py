"""A parsed launch line as recipe fields (``clusterkit import``): the launcher, its options
(those clusterkit writes itself consumed into the fields behind them, the rest ``launcher_args``),
the srun options (``srun:``), the interpreter, the program and its arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterkit.load.job_checks import OWNED_ENV, OWNED_ENV_PREFIXES, SHELL_ENV
from clusterkit.load.script_enroot import start_image
from clusterkit.load.script_header import LOGS
from clusterkit.load.script_launch import has_computed, normalise, wrapped_python
from clusterkit.load.script_text import LINE_LIMIT, Unmapped
from clusterkit.load.script_values import SHELL, literal_args, literal_program, run_time, substitute
from clusterkit.load.slurm_options import SBATCH_OPTIONS, SRUN_ONLY_OPTIONS
from clusterkit.spec.launchers import LAUNCHERS
from clusterkit.spec.step_options import STEP_OWNED

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported
    from clusterkit.load.script_header import Header
    from clusterkit.load.script_launch import Launch

STEP_DROPPED = {
    "nodes", "N", "ntasks", "n", "ntasks-per-node", "nodelist", "w", "output", "o", "error", "e", "open-mode",
    "jobid", "unbuffered", "u", "gres", "gpus", "gpus-per-node", "G", "export", "mem", "het-group", "pack-group",
}  # fmt: skip
SRUN_FIELDS = {
    "wait": "wait",
    "mpi": "mpi",
    "distribution": "distribution",
    "m": "distribution",
    "cpu-bind": "cpu_bind",
}
CONTAINER = "the cluster profile's container: (container_image)"
CONTAINER_PROGRAMS = frozenset("shifter singularity apptainer enroot docker podman ch-run charliecloud".split())
PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}


def map_launch(
    launch: Launch,
    out: dict[str, Any],
    resources: dict[str, Any],
    header: Header,
    variables: dict[str, str],
    imported: Imported,
    profile_python: list[str] | None,
) -> None:
    if not imported.generated:
        process_model(launch, resources, header, variables, imported)
    if launch.batch_shell:
        out["process_model"] = "batch_launcher"
    out["launcher"] = launch.launcher
    if launch.launcher == "mpirun" and launch.python[-1:] == ["-u"]:
        launch.python = launch.python[:-1]  # clusterkit's mpirun line writes -u itself
    if launch.python and launch.python != profile_python and launch.launcher != "command":
        out["python"] = launch.python[0] if len(launch.python) == 1 else launch.python
    program = literal_program(launch.program, variables, launch.line, imported)
    # task.program: no snapshot, no interpreter; a shell (/bin/bash run.sh) is a system program, whose
    # folder a task.script's snapshot would copy.
    exec_as_is = launch.launcher == "srun" or launch.batch_shell or bool(SHELL.match(program))
    task: dict[str, Any] = {"program" if exec_as_is else "script": program}
    if launch.module:
        task["module"] = True
    per_rank = launch.launcher in ("python", "srun")
    args = literal_args(program, launch.args, variables, launch.line, imported, per_rank)
    if args:
        task["args"] = args
    out["task"] = task
    srun: dict[str, Any] = {"kill_on_bad_exit": False}  # SLURM's default, where the script gives none
    extra: dict[str, Any] = {}
    for flag, value in launch.srun:
        if flag.startswith("$"):  # srun "${ARGS[@]}" --mpi=pmix ...: options only the shell knows
            imported.unmapped.append(
                Unmapped(launch.line, f"srun {flag}", "srun options from a shell variable or array", "srun.extra")
            )
        elif flag == "kill-on-bad-exit" or flag == "K":
            srun["kill_on_bad_exit"] = value not in ("0",)
        elif flag in ("label", "l"):
            srun["label"] = True
        elif (
            flag not in STEP_DROPPED
            and (flag not in STEP_OWNED or flag in SRUN_FIELDS)
            and value
            and run_time(value := substitute(value, variables))
        ):
            shown = f"srun --{flag}={value}".replace("\x00", "$(...)")
            imported.unmapped.append(Unmapped(launch.line, shown, "a run-time value in an srun option", "srun.extra"))
        elif flag in SRUN_FIELDS and value:
            srun[SRUN_FIELDS[flag]] = int(value) if flag == "wait" and value.isdigit() else value
        elif flag in ("cpus-per-task", "c") and value and value.isdigit():
            resources.setdefault("cpus_per_task", int(value))
        elif flag in ("ntasks-per-node",) and value and value.isdigit() and launch.launcher in ("python", "srun"):
            header.tasks_per_node = int(value)
        elif flag.startswith("container-") and _profile_container(imported, ("pyxis",), flag, value, out, launch.line):
            pass
        elif flag in STEP_DROPPED or flag in STEP_OWNED:
            imported.unmapped.append(
                Unmapped(launch.line, f"srun --{flag}", "clusterkit's launch step sets it", "resources / runs_dir")
            )
        elif len(flag) > 1:
            extra[flag] = True if value is None else value
            if flag not in SRUN_ONLY_OPTIONS and flag not in SBATCH_OPTIONS:  # a SPANK plugin's (pyxis...)
                imported.warnings.append(
                    f"line {launch.line}: srun --{flag}: an option srun has not, kept in srun.extra"
                )
        else:
            imported.unmapped.append(Unmapped(launch.line, f"srun -{flag}", "an srun option not mapped", "srun.extra"))
    if extra:
        srun["extra"] = extra
    if launch.srun or launch.launcher != "mpirun" and not launch.batch_shell:  # their own srun takes no srun: options
        out["srun"] = srun
    # Apptainer is Singularity renamed: either command is a profile's of either name.
    runtime = launch.container_runtime
    runtimes = ("apptainer", "singularity") if runtime in ("apptainer", "singularity") else (runtime,)
    image = None if launch.container is None else substitute(launch.container, variables)
    named = start_image(launch, image, out, imported) if runtime == "enroot" and image is not None else image
    if image is not None and (
        named is None
        or run_time(named)
        or not _profile_container(imported, runtimes, "container-image", named, out, launch.line)
    ):
        why = "a container the recipe cannot name: the program would run outside it"
        imported.unmapped.append(Unmapped(launch.line, f"{runtime} ... {image}", why, CONTAINER))
    if launch.launcher in ("command", "srun") and launch.program.rsplit("/", 1)[-1] in CONTAINER_PROGRAMS:
        why = "a container runtime as the program: kept as written, the recipe's container fields do not see it"
        imported.unmapped.append(Unmapped(launch.line, launch.program, why, CONTAINER))
    _around(launch, out, variables, imported)
    args: list[str] = []
    defaults = set(LAUNCHERS[launch.launcher].defaults) if imported.generated else set()
    budget = [LINE_LIMIT]  # for the whole line
    for name, flag, value in launch.options:
        if name in defaults:  # a rendered line: clusterkit's own default comes first
            defaults.discard(name)
            continue
        value = None if value is None else substitute(value, variables, budget=budget)
        if launch.launcher != "command" and owned_flag(launch.launcher, name):
            _owned(launch, name, value, out, resources, header, imported)
        elif value is not None and ("$" in value or has_computed([value])):
            shown = value.replace("\x00", "$(...)")
            imported.unmapped.append(
                Unmapped(launch.line, f"{flag} {shown}", "a run-time value in a launcher option", "launcher_args")
            )
        elif launch.launcher == "mpirun":
            args += [flag, *(value.split(" ") if value is not None else [])]
        else:
            args.append(flag if value is None else f"{flag}={value}")
    if args:
        out["launcher_args"] = args
    if launch.launcher in ("python", "srun") and header.tasks_per_node and header.gpus_per_node is None:
        header.gpus_per_node = header.tasks_per_node
    if launch.launcher in ("mpirun",) and launch.srun:
        imported.unmapped.append(Unmapped(launch.line, "srun mpirun", "mpirun starts its own daemons", "launcher"))


def _around(launch: Launch, out: dict[str, Any], variables: dict[str, str], imported: Imported) -> None:
    """What the launch line holds beside the launch: ``VAR=value`` before the command (the names
    clusterkit sets per rank are its own; a literal other goes to env), redirections, and the other
    commands of its ``bash -c`` string, listed."""
    for name, value in launch.prefix_env.items():
        literal = substitute(value, variables)
        if owner_of(name) is None and "$" not in literal and not has_computed([literal]):
            out.setdefault("env", {})[name] = literal
        elif owner_of(name) is None:
            imported.unmapped.append(
                Unmapped(launch.line, f"{name}={value}", "a run-time value on the launch line", "env")
            )
    for redirection in launch.redirections:
        imported.unmapped.append(Unmapped(launch.line, redirection, "a redirection of the launch", LOGS))
    for command in launch.beside:
        imported.unmapped.append(
            Unmapped(launch.line, command, "beside the launch in its bash -c", "hooks.pre_launch or setup")
        )


def _profile_container(
    imported: Imported, runtimes: tuple[str, ...], flag: str, value: str | None, out: dict[str, Any], line: int
) -> bool:
    """A container option the cluster profile's ``container:`` (of one of these runtimes) writes: its image,
    where another, becomes ``container_image``; False where the profile has no such container."""
    box = imported.profile.container if imported.profile is not None else None
    if box is None or box.runtime not in runtimes:
        return False
    if flag == "container-image" and value and value != box.image:
        out["container_image"] = value
    elif flag != "container-image" and not imported.generated:
        imported.unmapped.append(Unmapped(line, f"--{flag}={value}", "the profile's container settings", "container:"))
    return True


def _owned(
    launch: Launch,
    name: str,
    value: str | None,
    out: dict[str, Any],
    resources: dict[str, Any],
    header: Header,
    imported: Imported,
) -> None:
    """A launcher option clusterkit writes itself: into its field where its value is literal."""
    digits = value is not None and value.isdigit()
    if name in ("nproc-per-node", "num-gpus", "num-processes"):
        if digits and header.gpus_per_node is None and name != "num-processes":
            header.gpus_per_node = int(value)  # type: ignore[arg-type]
    elif name in ("nnodes", "num-nodes", "num-machines"):
        if digits:
            resources.setdefault("nodes", int(value))  # type: ignore[arg-type]
    elif name == "rdzv-backend" and value == "c10d" and launch.launcher == "torchrun":  # accelerate's: static
        out["rendezvous"] = "c10d"
    elif name in ("master-port", "main-process-port") and digits:
        out["master_port"] = int(value)  # type: ignore[arg-type]
    elif name == "rdzv-endpoint" and value and value.rpartition(":")[2].isdigit():
        out["master_port"] = int(value.rpartition(":")[2])
    elif name in ("include", "exclude") and value:
        out.setdefault("deepspeed", {})[name] = value
    elif name == "launcher" and value == "slurm":
        out["process_model"] = "batch_launcher"
    elif name == "config-file" and value and launch.launcher == "accelerate" and "{" not in value:
        if "$" in value or has_computed([value]):  # a file only the running shell can name
            shown = value.replace("\x00", "$(...)")
            imported.unmapped.append(
                Unmapped(launch.line, f"--{name}={shown}", "a run-time value in a launcher option", "accelerate.config")
            )
        else:
            out["accelerate"] = {"config": value}
    elif name == "mixed-precision" and value in PRECISIONS:
        out["precision"] = PRECISIONS[value]
    elif name not in ("node-rank", "machine-rank", "master-addr", "main-process-ip", "log-dir", "tee", "rdzv-id"):
        imported.unmapped.append(
            Unmapped(launch.line, f"--{name}" + (f"={value}" if value else ""), "set by clusterkit", "(see the field)")
        )


def process_model(
    launch: Launch, resources: dict[str, Any], header: Header, variables: dict[str, str], imported: Imported
) -> None:
    """The launcher that starts the processes the script starts, never an interpreter in front of a
    program that is no Python script: a program srun starts in several tasks per node is one per
    rank (``launcher: srun``, or ``python`` where a Python runs under a wrapper); a python in the
    batch shell on several nodes or GPUs is a front end that starts the ranks itself (GPT-NeoX's
    deepy.py), run there once (``process_model: batch_launcher``). Listed where none fits: a program
    under mpirun that is no Python script (clusterkit's mpirun line runs ``python -u``), and srun
    tasks per node that only the shell knows."""
    shown = " ".join([launch.program, *launch.args]).replace("\x00", "$(...)")[:80]
    if launch.launcher == "mpirun" and not launch.python and not launch.module and not launch.program.endswith(".py"):
        options = " ".join(f"{flag} {value or ''}".strip() for _, flag, value in launch.options).replace(
            "\x00", "$(...)"
        )
        why = "a program that is no Python script under mpirun (clusterkit's mpirun runs python): run once per node"
        nearest = "task.program with launcher: srun (a task per rank)"
        imported.unmapped.append(Unmapped(launch.line, f"mpirun {options} {shown}", why, nearest))
        launch.launcher, launch.options = "command", []
    elif launch.launcher == "python" and not launch.under_srun:
        nodes = resources.get("nodes") or 1
        if nodes > 1 or (header.gpus_per_node or 1) > 1 or (header.tasks_per_node or 1) > 1:
            interpreter = launch.python or ["python"]
            words = [*interpreter[1:], *(["-m"] if launch.module else []), launch.program, *launch.args]
            launch.launcher, launch.python, launch.module = "command", [], False
            launch.program, launch.args, launch.batch_shell = interpreter[0], words, True
    elif launch.launcher == "command":
        tasks = _tasks_per_node(launch, resources, header)
        if tasks is None:
            why = "a program srun starts in a number of tasks only the shell knows: launcher: command runs it once per node"
            nearest = "task.program with launcher: srun, and resources.gpus_per_node"
            imported.unmapped.append(Unmapped(launch.line, shown, why, nearest))
        elif tasks > 1:
            wrapped_python(launch, [launch.program, *launch.args])  # srun runs it on each task: one per rank
            launch.python = literal_args(launch.program, launch.python, variables, launch.line, imported, True)


def _tasks_per_node(launch: Launch, resources: dict[str, Any], header: Header) -> int | None:
    """How many tasks per node the launch's srun starts (its options, else the header's); None
    where a run-time value decides."""
    options = dict(launch.srun)
    per_node = options.get("ntasks-per-node")
    tasks = options.get("ntasks", options.get("n"))
    nodes = options.get("nodes", options.get("N")) or str(resources.get("nodes") or 1)
    for value in (per_node, tasks, nodes):
        if value is not None and not value.isdigit():
            return None
    if per_node is not None:
        return int(per_node)
    if tasks is not None:
        return -(-int(tasks) // max(1, int(nodes)))
    return header.tasks_per_node or 1


def owned_flag(launcher: str, name: str) -> bool:
    return normalise(name) in {normalise(flag) for flag in LAUNCHERS[launcher].owned}


def owner_of(name: str) -> str | None:
    """Who sets an environment variable a recipe may not (job_checks' names), or None."""
    owner = OWNED_ENV.get(name) or SHELL_ENV.get(name)
    return owner or next((who for prefix, who in OWNED_ENV_PREFIXES.items() if name.startswith(prefix)), None)

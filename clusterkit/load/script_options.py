"""A parsed launch line as recipe fields (``clusterkit import``): the launcher, its options
(those clusterkit writes itself consumed into the fields behind them, the rest ``launcher_args``),
the srun options (``srun:``), the interpreter, the program and its arguments."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from clusterkit.load.job_checks import OWNED_ENV, OWNED_ENV_PREFIXES, SHELL_ENV
from clusterkit.load.script_header import LOGS
from clusterkit.load.script_launch import has_computed, normalise, wrapped_python
from clusterkit.load.script_text import LINE_LIMIT, Unmapped
from clusterkit.load.slurm_options import SBATCH_OPTIONS, SRUN_ONLY_OPTIONS
from clusterkit.spec.launch_plan import STEP_OWNED
from clusterkit.spec.launchers import LAUNCHERS

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported
    from clusterkit.load.script_header import Header
    from clusterkit.load.script_launch import Launch

SLURM_VALUES = {"SLURM_JOB_ID": "{job_id}", "SLURM_JOBID": "{job_id}", "SLURM_NODEID": "{node_rank}"}
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
STEP_DROPPED = {
    "nodes", "N", "ntasks", "n", "ntasks-per-node", "nodelist", "w", "output", "o", "error", "e", "open-mode",
    "jobid", "unbuffered", "u", "gres", "gpus", "gpus-per-node", "G", "export", "mem",
}  # fmt: skip
SRUN_FIELDS = {
    "wait": "wait",
    "mpi": "mpi",
    "distribution": "distribution",
    "m": "distribution",
    "cpu-bind": "cpu_bind",
}
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
    per_node = next((v for f, v in launch.srun if f == "ntasks-per-node" and v and v.isdigit()), None)
    if launch.batch_shell:
        out["process_model"] = "batch_launcher"
    elif launch.launcher == "command" and int(per_node or header.tasks_per_node or 1) > 1:
        wrapped_python(launch, [launch.program, *launch.args])  # srun runs it on each task: one per rank
        launch.python = literal_args(launch.python, variables, launch.line, imported)  # a wrapper's words too
    out["launcher"] = launch.launcher
    if launch.launcher == "mpirun" and launch.python[-1:] == ["-u"]:
        launch.python = launch.python[:-1]  # clusterkit's mpirun line writes -u itself
    if launch.python and launch.python != profile_python and launch.launcher != "command":
        out["python"] = launch.python[0] if len(launch.python) == 1 else launch.python
    program = substitute(launch.program, variables)
    if "$" in program or has_computed([program]):
        imported.unmapped.append(
            Unmapped(launch.line, program.replace("\x00", "$(...)"), "a run-time value in the program", "task.script")
        )
    exec_as_is = launch.launcher == "srun" or launch.batch_shell  # task.program: no snapshot, no interpreter
    task: dict[str, Any] = {"program" if exec_as_is else "script": program.replace("\x00", "$(...)")}
    if launch.module:
        task["module"] = True
    if launch.args:
        task["args"] = literal_args(launch.args, variables, launch.line, imported)
    out["task"] = task
    srun: dict[str, Any] = {"kill_on_bad_exit": False}  # SLURM's default, where the script gives none
    extra: dict[str, Any] = {}
    for flag, value in launch.srun:
        if flag == "kill-on-bad-exit" or flag == "K":
            srun["kill_on_bad_exit"] = value not in ("0",)
        elif flag in ("label", "l"):
            srun["label"] = True
        elif flag in SRUN_FIELDS and value:
            srun[SRUN_FIELDS[flag]] = int(value) if flag == "wait" and value.isdigit() else value
        elif flag in ("cpus-per-task", "c") and value and value.isdigit():
            resources.setdefault("cpus_per_task", int(value))
        elif flag in ("ntasks-per-node",) and value and value.isdigit() and launch.launcher in ("python", "srun"):
            header.tasks_per_node = int(value)
        elif flag.startswith("container-") and _profile_container(imported, "pyxis", flag, value, out, launch.line):
            pass
        elif flag in STEP_DROPPED or flag in STEP_OWNED:
            imported.unmapped.append(
                Unmapped(launch.line, f"srun --{flag}", "clusterkit's launch step sets it", "resources / runs_dir")
            )
        elif value is not None and ("$" in value or has_computed([value])):
            imported.unmapped.append(
                Unmapped(launch.line, f"srun --{flag}", "a run-time value in an srun option", "srun.extra")
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
    if launch.container is not None and not _profile_container(
        imported, "apptainer", "container-image", launch.container, out, launch.line
    ):
        imported.unmapped.append(
            Unmapped(launch.line, f"apptainer exec ... {launch.container}", "a container", "a profile's container:")
        )
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
    imported: Imported, runtime: str, flag: str, value: str | None, out: dict[str, Any], line: int
) -> bool:
    """A container option the cluster profile's ``container:`` (of this runtime) writes: its image,
    where another, becomes ``container_image``; False where the profile has no such container."""
    box = imported.profile.container if imported.profile is not None else None
    if box is None or box.runtime != runtime:
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


def substitute(
    value: str, variables: dict[str, str], keep_self: str | None = None, budget: list[int] | None = None
) -> str:
    """``value`` with the script's own variables read in, at most LINE_LIMIT characters of them
    (V2="$V1 $V1" doubles each line), or what is left of ``budget`` (shared by the words of one
    line); a variable past that stays as written: a run-time value."""
    left = budget if budget is not None else [LINE_LIMIT]

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables or name == keep_self or len(variables[name]) > left[0]:
            return match.group(0)
        left[0] -= len(variables[name])
        return variables[name]

    return VARIABLE.sub(one, value)


def literal_args(words: list[str], variables: dict[str, str], line: int, imported: Imported) -> list[str]:
    """Program arguments with the script's own literal variables and SLURM's ids filled in; a word
    still reading a shell variable is listed (arguments reach the program literally)."""
    out, budget, known = [], [LINE_LIMIT], {**variables, **SLURM_VALUES}
    for word in words:
        value = substitute(word, known, budget=budget)
        if "$" in value or has_computed([value]):
            imported.unmapped.append(
                Unmapped(line, word.replace("\x00", "$(...)"), "a run-time value in an argument", "task.args or env")
            )
        out.append(value.replace("\x00", "$(...)"))
    return out


def owned_flag(launcher: str, name: str) -> bool:
    return normalise(name) in {normalise(flag) for flag in LAUNCHERS[launcher].owned}


def owner_of(name: str) -> str | None:
    """Who sets an environment variable a recipe may not (job_checks' names), or None."""
    owner = OWNED_ENV.get(name) or SHELL_ENV.get(name)
    return owner or next((who for prefix, who in OWNED_ENV_PREFIXES.items() if name.startswith(prefix)), None)

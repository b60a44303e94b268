"""A heterogeneous job's components (``clusterkit import``): each ``#SBATCH hetjob`` header group after
the first (group 0 is the job's: training) is a component's resources, never the job's; a
hand-written script's ``srun --het-group=N`` line is component N's step (its command, srun options
and env). A script clusterkit rendered runs its components from plan.json, read from there.

What no component field holds is listed with its line, as everything else import cannot map
(:mod:`clusterkit.spec.components` says which options are whose).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from clusterkit.load.script_header import GPU_COUNT, header_options
from clusterkit.load.script_launch import PYTHON, srun_step
from clusterkit.load.script_options import owner_of
from clusterkit.load.script_text import COMPUTED, Command, Unmapped, split_commands
from clusterkit.spec.components import (
    COMPONENT_NAME_PATTERN,
    COMPONENT_SBATCH,
    COMPONENT_SRUN,
    JOB_WIDE_SBATCH,
    RESERVED_NAMES,
    Component,
)

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported

HET_GROUP = ("het-group", "pack-group")  # srun's option naming the group a step runs in (pack: its old name)
SRUN_SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "G": "gpus", "w": "nodelist", "o": "output",
              "e": "error", "l": "label", "p": "partition"}  # fmt: skip
COMPONENT_FIELDS = frozenset(Component.__struct_fields__)
FLAG = re.compile(r"^[a-z][a-z0-9-]*$")  # a component's sbatch/srun flag (spec.components' _FLAG)


def read_components(groups: list[list[Command]], commands: list[Command], imported: Imported) -> list[Command]:
    """``groups``: the header groups after the job's. Each as a component (``components`` of
    ``imported``'s recipe parts); returns ``commands`` less the lines read as components' steps."""
    components = [_resources(group, index, imported) for index, group in enumerate(groups)]
    rest, stepped = [], set()
    for command in commands:
        listed = not command.text.replace("\t", " ").isprintable()  # a quoted line break: import lists it
        group = None if imported.generated or listed else _step_group(command.words)
        if group is None or not 1 <= group <= len(components):
            rest.append(command)
            continue
        _step(command, components[group - 1], group - 1, imported)
        imported.mapped.append(command.line)
        stepped.add(group - 1)
    for index, component in enumerate(components):
        if index not in stepped and not imported.generated:
            why = f"het group {index + 1}: no srun --het-group={index + 1} line starts its program"
            imported.unmapped.append(Unmapped(groups[index][0].line, "#SBATCH hetjob", why, f"{_at(index)}.command"))
        component["command"] = component["command"] or ["true"]
    _name(components)
    imported.components = components
    return rest


def plan_components(plan: dict[str, Any], imported: Imported) -> None:
    """A rendered script's components as its plan.json runs them: their names, commands, env,
    srun options and readiness (the header groups gave their resources). The plan is data: one that
    does not read as a component list is listed, and nothing of it taken."""
    try:
        read = [_planned(entry, len(imported.components)) for entry in plan.get("components") or []]
    except (KeyError, TypeError, ValueError, AttributeError):
        why = "its launch plan's components do not read as clusterkit writes them"
        imported.unmapped.append(Unmapped(0, "plan.json components", why, "components:"))
        return
    for group, fields in read:
        imported.components[group - 1].update(fields)


def _planned(entry: dict[str, Any], groups: int) -> tuple[int, dict[str, Any]]:
    """One plan.json component: (its het group, its fields); ValueError where it is no such entry."""
    step = entry["step"]
    group, argv, env = step["het_group"], step["argv"], step["env"]
    if not (isinstance(group, int) and 1 <= group <= groups and isinstance(argv, list) and isinstance(env, dict)):
        raise ValueError("not a component entry")
    fields: dict[str, Any] = {"name": str(entry["name"]), "command": [str(word) for word in argv]}
    srun = {}
    for option in step["srun"]:
        flag, equals, value = str(option).removeprefix("--").partition("=")
        if flag not in COMPONENT_SRUN:  # those the supervisor writes from the fields
            srun[flag] = value if equals else True
    for key, value in (("srun", srun), ("env", dict(env))):
        if value:
            fields[key] = value
    if entry.get("port") is not None:
        fields["port"] = int(entry["port"])
    fields["ready_timeout_s"] = int(entry["ready_timeout_s"])
    return group, fields


def _at(index: int) -> str:
    return f"components[{index}]"


def _resources(group: list[Command], index: int, imported: Imported) -> dict[str, Any]:
    """A header group's options as a component's fields; the job's own options listed."""
    options, lines = header_options(group)
    component: dict[str, Any] = {"name": f"group{index + 1}", "command": []}
    sbatch: dict[str, Any] = {}
    nodes = options.get("nodes") or "1"
    for flag, value in options.items():
        line, shown = lines.get(flag, group[0].line), f"--{flag}" + ("" if value is None else f"={value}")
        number = int(value) if value and value.isdigit() and len(value) < 8 else None
        gpus = GPU_COUNT.match(value.split(",")[0]) if value else None
        if flag in JOB_WIDE_SBATCH:
            why = f"job-wide in a component's group (het group {index + 1})"
            imported.unmapped.append(Unmapped(line, shown, why, JOB_WIDE_SBATCH[flag]))
        elif flag == "nodes" and number:
            component["nodes"] = number
        elif flag == "ntasks-per-node" and number:
            component["ranks_per_node"] = number
        elif flag == "ntasks" and number and nodes.isdigit() and number % int(nodes) == 0:
            component["ranks_per_node"] = number // int(nodes)
        elif flag in ("gres", "gpus-per-node") and gpus:
            component["gpus_per_node"] = int(gpus.group(1))
        elif flag == "gpus" and gpus and nodes.isdigit() and int(gpus.group(1)) % int(nodes) == 0:
            component["gpus_per_node"] = int(gpus.group(1)) // int(nodes)
        elif flag == "cpus-per-task" and number:
            component["cpus_per_task"] = number
        elif flag == "partition" and value and COMPUTED not in value:
            component["partition"] = value
        elif flag in COMPONENT_SBATCH or not FLAG.match(flag) or (value is not None and COMPUTED in value):
            why = f"het group {index + 1}: a value no component field holds as written"
            imported.unmapped.append(Unmapped(line, shown, why, f"{_at(index)}.{COMPONENT_SBATCH.get(flag, 'sbatch')}"))
        else:
            sbatch[flag] = True if value is None else (number if number is not None else value)
    if sbatch:
        component["sbatch"] = sbatch
    return component


def _step_group(words: list[str]) -> int | None:
    """The het group an ``srun --het-group=N`` step on this line runs in (one number only)."""
    for part in split_commands(words):
        step = srun_step(part)
        for flag, value in step[1] if step else []:
            if flag in HET_GROUP and value and value.isdigit():
                return int(value)
    return None


def _step(command: Command, component: dict[str, Any], index: int, imported: Imported) -> None:
    """An ``[VAR=value] srun --het-group=N [options] argv`` line as the component's step."""
    line, where = command.line, _at(index)
    for part in split_commands(command.words):
        step = srun_step(part)
        if step is None or _step_group(part) != index + 1:
            why = "beside a component's step on its line"
            imported.unmapped.append(Unmapped(line, " ".join(part), why, "hooks.pre_launch"))
            continue
        env, options, argv, redirections = step
        component["command"] = argv
        srun: dict[str, Any] = {}
        for flag, value in options:
            flag = SRUN_SHORT.get(flag, flag)
            shown = f"srun --{flag}" + ("" if value is None else f"={value}")
            if flag in HET_GROUP:
                continue
            if flag in COMPONENT_SRUN or flag in ("partition", "export"):
                nearest = {"partition": "partition", "export": "env"}.get(flag) or COMPONENT_SRUN[flag]
                why = "clusterkit's component step sets it" if flag in COMPONENT_SRUN else "not an srun option here"
                field = nearest.split(" ")[0] in COMPONENT_FIELDS  # else: the run directory, or nothing
                imported.unmapped.append(Unmapped(line, shown, why, f"{where}.{nearest}" if field else nearest))
            elif not FLAG.match(flag) or (value is not None and ("$" in value or COMPUTED in value)):
                imported.unmapped.append(Unmapped(line, shown, "a run-time value or no long option", f"{where}.srun"))
            else:
                srun[flag] = True if value is None else value
        for redirection in redirections:
            why = "its output goes to component_<name>_<rank>.out|err in the run directory"
            imported.unmapped.append(Unmapped(line, redirection, why, "runs_dir"))
        listed = {name for name, value in env.items() if "$" in value or COMPUTED in value or owner_of(name)}
        for name in sorted(listed):
            shown, owner = f"{name}={env[name]}".replace(COMPUTED, "$(...)"), owner_of(name)
            why = f"set by {owner}" if owner else "a run-time value"
            imported.unmapped.append(Unmapped(line, shown, why, "remove it" if owner else f"{where}.env"))
        for key, value in (("srun", srun), ("env", {k: v for k, v in env.items() if k not in listed})):
            if value:
                component[key] = value
        why = "the port it answers on (training waits for it) is not in the script"
        imported.unmapped.append(Unmapped(line, " ".join(argv[:3]), why, f"{where}.port"))


def _name(components: list[dict[str, Any]]) -> None:
    """A hand-written component's name from its program (``python -m reward_server``: reward_server),
    else ``group<N>``; names stay unique and none is reserved."""
    taken: set[str] = set()
    for number, component in enumerate(components, 1):
        argv = component["command"]
        program = argv[2] if PYTHON.match(argv[0]) and argv[1:2] == ["-m"] and len(argv) > 2 else argv[0]
        name = re.sub(r"[^a-z0-9_]", "_", program.rsplit("/", 1)[-1].lower()).lstrip("_0123456789")[:32]
        if component["name"] != f"group{number}" or argv == ["true"]:  # plan.json's name, or no program
            name = component["name"]
        if not re.match(COMPONENT_NAME_PATTERN, name) or name in RESERVED_NAMES or name in taken:
            name = f"group{number}"
        component["name"] = name
        taken.add(name)

"""``clusterkit import``: a hand-written batch script as a recipe (a dict, written as YAML by the
command), with what could not be mapped listed by line. The script is read as words
(:mod:`clusterkit.load.script_text`), never run; the header goes through
:mod:`clusterkit.load.script_header`, the launch through :mod:`clusterkit.load.script_launch`.

A script clusterkit rendered itself ``exec``s its supervisor on ``plan.json``: its launch is that
file's (read as JSON beside the script), and its own preamble is recognised as clusterkit's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterkit.load.script_components import plan_components, read_components
from clusterkit.load.script_enroot import EnrootStep, enroot_step, unused_steps
from clusterkit.load.script_header import Header, header_groups, read_header
from clusterkit.load.script_launch import Launch, launcher_of, parse_launch, wrapped_python
from clusterkit.load.script_options import map_launch, owner_of
from clusterkit.load.script_steps import launch_index, other_launches
from clusterkit.load.script_text import COMPUTED, LINE_LIMIT, Command, ScriptText, Unmapped, split_commands, words_of
from clusterkit.load.script_values import VARIABLE, defaults_of, substitute
from clusterkit.spec.bounded_read import CONFIG_LIMIT, read_bounded
from clusterkit.spec.recipe import NAME_PATTERN

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile

SETUP_COMMANDS = frozenset({"module", "ml", "source", ".", "cd", "conda", "ulimit", "umask", "mamba", "spack"})
# Lines of clusterkit's own rendered preamble (rendered again from the recipe, so not imported).
ASSIGNED = re.compile(r"(?:^|[\s;()])(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)\+?=")
GENERATED_OWN = re.compile(
    r"^(set [-+]e?u|mkdir -p -- |RUN_DIR=|CLUSTERKIT_JOB_ID=|export RUN_DIR |secrets_file=|unset secret|trap |exec )"
)


@dataclass
class Imported:
    recipe: dict[str, Any]
    header: Header
    launch: Launch | None
    env: dict[str, str | None] = field(default_factory=dict)  # the script's exports, as written
    unmapped: list[Unmapped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mapped: list[int] = field(default_factory=list)  # line numbers mapped to a field
    kept: list[int] = field(default_factory=list)  # line numbers kept as setup/hook lines
    generated: bool = False  # a rendered script: its setup lines stay as written
    env_lines: dict[str, int] = field(default_factory=dict)  # where each variable was set
    profile: ClusterProfile | None = None
    uncertain: set[str] = field(default_factory=set)  # set again where only the shell decides (if/for)
    plain: dict[str, Command] = field(default_factory=dict)  # NAME=value (not exported), for later lines
    defaults: dict[str, str] = field(default_factory=dict)  # `: "${NAME:=value}"`: value unless the submitter's
    components: list[dict[str, Any]] = field(default_factory=list)  # a heterogeneous job's later header groups
    enroot_steps: list[EnrootStep] = field(default_factory=list)  # enroot import/create/remove commands
    enroot_used: list[EnrootStep] = field(default_factory=list)  # those the launch's image was read from


def import_script(script: ScriptText, profile: ClusterProfile | None = None) -> Imported:
    """``script`` as a recipe; ``profile``: the cluster profile it is for (its python, and its own
    modules and setup lines, which the recipe need not repeat)."""
    profile_python = (
        None if profile is None else ([profile.python] if isinstance(profile.python, str) else list(profile.python))
    )
    own = set() if profile is None else {*profile.setup, *(f"module load {m}" for m in profile.modules)}
    groups = header_groups(script.directives)
    header = read_header(groups[0])  # a heterogeneous job's group 0: the job's own
    imported = Imported({}, header, None, unmapped=list(script.unmapped) + header.unmapped, warnings=header.warnings)
    imported.generated, imported.profile = script.generated, profile
    imported.mapped += [directive.line for directive in script.directives]
    imported.uncertain = {
        name for u in script.unmapped if "only as the shell decides" in u.why for name in ASSIGNED.findall(u.text)
    }
    variables: dict[str, str] = {}
    recipe: dict[str, Any] = {"env": {}, "setup": [], "hooks": {"pre_launch": [], "post_run": []}}
    commands = [
        c for c in script.commands if not (script.generated and GENERATED_OWN.match(c.text)) and c.text not in own
    ]
    commands = read_components(groups[1:], commands, imported)
    launch_at = None if script.generated else launch_index(commands)
    imported.unmapped += other_launches(commands, launch_at)
    for index, command in enumerate(commands):
        if index == launch_at:
            if not script.generated:
                words = _expanded(_launch_words(command, imported), variables)
                imported.launch = parse_launch(command.line, words)
            imported.mapped.append(command.line)
            continue
        _command(command, recipe, variables, imported, after=launch_at is not None and index > launch_at)
    if script.generated:
        imported.launch = _plan_launch(script, recipe, imported)
    _build(imported, recipe, variables, profile_python, script)
    return imported


def _launch_words(command: Command, imported: Imported) -> list[str]:
    parts = split_commands(command.words)
    chosen = next((p for p in reversed(parts) if launcher_of(p) or p[:1] == ["srun"]), parts[-1])
    for part in parts:
        if part is not chosen:
            imported.unmapped.append(
                Unmapped(command.line, " ".join(part), "on the launch line beside the launch", "hooks.pre_launch")
            )
    return chosen


def _expanded(words: list[str], variables: dict[str, str]) -> list[str]:
    """The launch line's words with the script's own variables read in, as the batch shell would:
    a ``$NAME`` word is split into the words of its value; in a shell's ``-c`` string the value is
    put in place (the string is read as a line again). ``srun $SRUN_ARGS bash -c "$CMD"``."""
    out: list[str] = []
    budget = [LINE_LIMIT]  # for the whole line: `srun $V $V $V ...` stays bounded
    for at, word in enumerate(words):
        whole = VARIABLE.fullmatch(word)
        name = whole and (whole.group(1) or whole.group(2))
        if at and words[at - 1] == "-c":  # \$ in double quotes: a $ for the inner shell (shlex keeps the \)
            out.append(re.sub(r"\\([$`])", r"\1", substitute(word, variables, budget=budget)))
        elif name and name in variables and len(variables[name]) <= budget[0]:
            budget[0] -= len(variables[name])
            split = words_of(variables[name])
            out += [word] if split is None else split
        else:
            out.append(word)
    return out


def _command(command: Command, recipe: dict, variables: dict, imported: Imported, after: bool) -> None:
    words, line = command.words, command.line
    parts = split_commands(words)
    assignment = words[0] in ("export", "readonly", "declare", "local") or "=" in words[0]
    if not command.text.replace("\t", " ").isprintable():  # a quoted line break or a control character
        imported.unmapped.append(
            Unmapped(line, command.text, "a command over several lines or with control characters")
        )
        if assignment and re.sub(r"[\t\n]", " ", command.text).isprintable():  # line breaks only
            _remember(words, variables, imported.uncertain)
        return
    if command.computed and imported.generated:  # a rendered script's setup line, as its recipe wrote it
        recipe["setup"].append((command.line, command.text))
        imported.kept.append(line)
        return
    if command.computed and assignment:
        imported.unmapped.append(Unmapped(line, command.text, "a computed value ($(...) or backticks)"))
        if "=" in words[0]:
            _plain(command, imported)
        _remember(words, variables, imported.uncertain)  # its computed part marked
        return
    if len(parts) == 1 and words[0] in ("export", "unset") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        if len(parts) == 1 and _environment(words, command, recipe, variables, imported):
            return
    step = enroot_step(line, command.text, words, variables)
    if step is not None:  # a hook line unless the launch's enroot start reads its image from it
        imported.enroot_steps.append(step)
    first = words[0]
    if first == ":":
        imported.defaults.update(defaults_of(words[1:], variables))
    if first == "set" and all(w.startswith(("-", "+")) or w == "pipefail" for w in words[1:]):
        if "x" in "".join(w for w in words[1:] if w.startswith("-")):
            recipe["setup"].append((command.line, command.text))
            imported.kept.append(line)
        else:
            imported.mapped.append(line)  # clusterkit's batch shell runs under set -euo pipefail
        return
    if after and first in ("wait", "exit"):
        imported.mapped.append(line)
        return
    if first in SETUP_COMMANDS and not after:
        recipe["setup"].append((command.line, command.text))
    else:
        recipe["hooks"]["post_run" if after else "pre_launch"].append(command.text)
    imported.kept.append(line)


def _listed_value(value: str) -> bool:
    """A value read from a listed assignment (computed, or over several lines): no field holds it."""
    return COMPUTED in value or "\n" in value


def _remember(words: list[str], variables: dict[str, str], uncertain: set[str]) -> None:
    """The values of an assignment that is listed, not mapped: a launch built from them reads them."""
    for word in words[1:] if words[0] == "export" else words:
        name, equals, value = word.partition("=")
        if equals and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) and name not in uncertain:
            variables[name] = substitute(value, variables)


def _environment(words: list[str], command: Command, recipe: dict, variables: dict, imported: Imported) -> bool:
    """``export A=B``, ``A=B``, ``unset A``: env and the shell variables later lines use."""
    exported = words[0] == "export"
    if words[0] == "unset":
        for name in words[1:]:
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                recipe["env"][name] = None
                imported.env[name] = None
        imported.mapped.append(command.line)
        return True
    as_setup = False
    for word in words[1:] if words[0] in ("export",) else words:
        name, equals, value = word.partition("=")
        if word.startswith("-") or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            return False
        if not equals:
            if name in variables and not _listed_value(variables[name]):
                recipe["env"][name] = variables[name]
                imported.env[name] = variables[name]
            continue
        if exported:
            imported.env[name] = value
        literal = substitute(value, variables, keep_self=name)
        edit = None if imported.generated else _path_edit(name, literal)
        imported.env_lines[name] = command.line
        if exported and edit is None and "$" in literal and owner_of(name):
            imported.unmapped.append(Unmapped(command.line, f"export {name}", f"set by {owner_of(name)}", "remove it"))
        elif edit is not None and exported:
            recipe["env"][name] = _joined_edit(recipe["env"].get(name), edit)
        elif "$" in literal or _listed_value(literal):  # a run-time value, or one read from a listed one
            as_setup = True
        elif exported:
            recipe["env"][name] = literal
        if name not in imported.uncertain:  # else its value is the shell's to decide: a run-time value
            variables[name] = literal
    if not exported:
        _plain(command, imported)
    if as_setup and exported:
        recipe["setup"].append((command.line, command.text))  # a run-time value: exact as a setup line
        imported.kept.append(command.line)
    else:
        imported.mapped.append(command.line)
    return True


def _plain(command: Command, imported: Imported) -> None:
    """A shell variable's assignment (``NAME=value``, not exported), kept as a setup line where a
    line the recipe keeps reads it."""
    if len(split_commands(command.words)) == 1:
        for word in command.words:
            name, equals, _ = word.partition("=")
            if equals and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) and owner_of(name) is None:
                imported.plain[name] = command  # not MASTER_ADDR & co: the job sets those itself


def _read_plain(recipe: dict, imported: Imported) -> list[str]:
    """The setup lines, with each plain assignment a kept line (setup, hook, env value) reads put
    in before them, in the script's order (a computed one is then kept, not listed)."""
    texts = [text for _, text in recipe["setup"]] + [t for hooks in recipe["hooks"].values() for t in hooks]
    texts += [str(value) for value in recipe["env"].values() if value is not None]
    needed: dict[int, Command] = {}
    names = {m.group(1) or m.group(2) for text in texts for m in VARIABLE.finditer(text)}
    while names:
        name = names.pop()
        command = imported.plain.get(name)
        if command is not None and command.line not in needed and not imported.generated:
            needed[command.line] = command
            names |= {m.group(1) or m.group(2) for m in VARIABLE.finditer(command.text)}
    have = {line for line, _ in recipe["setup"]}
    added = [(line, c.text) for line, c in needed.items() if line not in have]
    imported.unmapped = [u for u in imported.unmapped if not (u.line in needed and u.text == needed[u.line].text)]
    imported.kept += [line for line, _ in added]
    imported.mapped = [line for line in imported.mapped if line not in needed]
    return [text for _, text in sorted(recipe["setup"] + added, key=lambda entry: entry[0])]


def _path_edit(name: str, value: str) -> dict[str, str] | None:
    """``/x:$NAME`` -> {prepend: /x}; ``$NAME:/x`` -> {append: /x}."""
    for own in (f"${name}", f"${{{name}}}"):
        if value.endswith(":" + own) and "$" not in value[: -len(own) - 1]:
            return {"prepend": value[: -len(own) - 1]}
        if value.startswith(own + ":") and "$" not in value[len(own) + 1 :]:
            return {"append": value[len(own) + 1 :]}
    return None


def _joined_edit(before: Any, edit: dict[str, str]) -> dict[str, str]:
    """A path edit after an earlier one of the same variable: both apply (a later prepend goes in
    front of the earlier one, a later append after it)."""
    if not isinstance(before, dict):
        return edit
    joined = dict(before)
    if "prepend" in edit:
        joined["prepend"] = ":".join(p for p in (edit["prepend"], before.get("prepend")) if p)
    if "append" in edit:
        joined["append"] = ":".join(p for p in (before.get("append"), edit["append"]) if p)
    return joined


def _plan_launch(script: ScriptText, recipe: dict, imported: Imported) -> Launch | None:
    """A rendered script's launch, from the plan.json beside it (read as data)."""
    try:
        plan = json.loads(read_bounded(Path(script.path).parent / "plan.json", CONFIG_LIMIT, "a launch plan"))
        launch = plan_launch(plan)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        launch = None
    if launch is None:
        imported.unmapped.append(Unmapped(0, "exec ... plan.json", "its launch plan is not beside it", "task:"))
        return None
    recipe["hooks"] = {"pre_launch": list(plan.get("pre_launch") or []), "post_run": list(plan.get("post_run") or [])}
    plan_components(plan, imported)
    for setup in (plan.get("container_setup") or {}).values():  # enroot's import, create, remove
        if isinstance(setup, dict) and (step := enroot_step(0, "", [str(w) for w in setup["argv"]], {})):
            imported.enroot_steps.append(step)
    return launch


def plan_launch(plan: dict[str, Any]) -> Launch | None:
    """The launch step of a launch plan (plan.json) as a parsed launch line."""
    step = plan["launch"]
    argv = [str(word) for word in step["argv"]]
    ranked = False  # whether clusterkit's rank program starts each rank (DeepSpeed's and mpirun's batch launch)
    for at in range(len(argv) - 1):  # the node agent's wrapper around each rank (batch launchers)
        if argv[at].endswith("supervisor/__main__.py") and argv[at + 1] == "rank":
            del argv[at : at + 2]
            ranked = True
            break
    if step.get("hosts") == "batch" and not ranked and argv:  # a front end of the user's, run as it is
        return Launch(0, "command", program=argv[0], args=argv[1:], batch_shell=True)
    launch = parse_launch(0, ["srun", *map(str, step["srun"]), *argv], literal=True)
    if launch is not None and step.get("tasks_per_node", 1) != 1 and launch.launcher == "command":
        wrapped_python(launch, argv)
    if launch is not None and step.get("ranks") == "task" and launch.launcher == "command" and launch.args:
        # launcher python whose interpreter is no python (`python: bash` runs a shell script per rank)
        launch.launcher, launch.python = "python", [launch.program]
        launch.program, launch.args = launch.args[0], launch.args[1:]
    return launch


def _build(
    imported: Imported, recipe: dict, variables: dict, profile_python: list[str] | None, script: ScriptText
) -> None:
    header, launch = imported.header, imported.launch
    name = header.name or Path(script.path).stem
    if not re.match(NAME_PATTERN, name):
        name = re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-._")[:64] or "imported"
    out: dict[str, Any] = {"name": name}
    resources = dict(header.resources)
    if launch is None:
        why = "no launch line found (steps of utilities only, or the work inside a loop or conditional)"
        imported.unmapped.append(Unmapped(0, "", why, "task.script (and launcher)"))
        out["launcher"] = "command"
        out["task"] = {"script": "true"}
    else:
        map_launch(launch, out, resources, header, variables, imported, profile_python)
        recipe["env"].update(out.pop("env", {}))  # VAR=value words before the launch command
    unused_steps(imported, recipe)
    if header.gpus_per_node is not None:
        resources["gpus_per_node"] = header.gpus_per_node
    out["resources"] = resources
    if header.preemption:
        out["preemption"] = header.preemption
    out["network"] = {"profile": "none"}  # the environment is exactly the script's
    env = recipe["env"]
    _owned_env(env, out, imported)
    if not script.generated and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = None  # clusterkit's default, not the script's
    recipe["setup"] = _read_plain(recipe, imported)
    for key in ("env", "setup"):
        if recipe[key]:
            out[key] = recipe[key]
    hooks = {k: v for k, v in recipe["hooks"].items() if v}
    if hooks:
        out["hooks"] = hooks
    if imported.components:
        out["components"] = imported.components
    imported.recipe = out


def _owned_env(env: dict[str, Any], out: dict[str, Any], imported: Imported) -> None:
    """Names the job sets itself (MASTER_PORT, RANK, SLURM_*...) out of env: a literal
    MASTER_PORT becomes master_port, the others are listed."""
    for name in list(env):
        owner = owner_of(name)
        if owner is None or (name == "PATH" and isinstance(env[name], dict)):
            continue
        value = env.pop(name)
        if name == "MASTER_PORT" and isinstance(value, str) and value.isdigit() and 1024 <= int(value) <= 65535:
            out.setdefault("master_port", int(value))
        else:
            line = imported.env_lines.get(name, 0)
            imported.unmapped.append(Unmapped(line, f"export {name}", f"set by {owner}", "remove it"))

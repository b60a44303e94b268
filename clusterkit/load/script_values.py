"""Shell values in a launch's argv (``clusterkit import``): the program and its arguments reach the
program literally, so a word that is still a shell expansion after the script's own variables are
read in (``"$@"``, ``$1``, ``${1:-x}``, ``$SLURM_PROCID``) is never written into them. It is left
out and listed with the field nearest to it, or written as clusterkit's run-time value where that
means exactly the same (:mod:`clusterkit.spec.runtime_values`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from clusterkit.load.script_launch import has_computed
from clusterkit.load.script_text import LINE_LIMIT, Unmapped

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported

# SLURM's ids with a run-time value of the same meaning wherever the launch runs.
SLURM_VALUES = {"SLURM_JOB_ID": "{job_id}", "SLURM_JOBID": "{job_id}", "SLURM_NODEID": "{node_rank}"}
# SLURM's per-task ids: the same as clusterkit's only where srun starts a task per rank (launcher: python).
TASK_VALUES = {"SLURM_PROCID": "{rank}", "SLURM_LOCALID": "{local_rank}"}
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# The script's own arguments: $@ $* $1 ${1:-x} ${@} ... (and $# of them)
POSITIONAL = re.compile(r"\$(?:[@*#0-9]|\{[@*#0-9])")
WORDS_OF_ARGUMENTS = re.compile(r"^\$(?:[@*]|\{[@*]\})$")  # "$@": any number of words, maybe none
DEFAULT = re.compile(r"\$\{(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+):?[-=]([^$`\x00{}]*)\}")
ASSIGNED_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?=([^}]*)\}")
SHELL = re.compile(r"^(.*/)?(ba|z|da|k)?sh$")
SUBMIT_ARGS = "clusterkit submit RECIPE -- ARGS (arguments after task.args)"


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


def run_time(value: str) -> bool:
    return "$" in value or has_computed([value])


def nearest_field(word: str) -> str:
    """The field a run-time value in an argument is nearest to."""
    if POSITIONAL.search(word):
        return SUBMIT_ARGS
    names = {m.group(1) or m.group(2) for m in VARIABLE.finditer(word)}
    own = [TASK_VALUES[name] for name in sorted(names & TASK_VALUES.keys())]
    if own:
        return f"{', '.join(own)} (in a task per rank: launcher: python)"
    return "task.args or env"


def literal_args(
    program: str, words: list[str], variables: dict[str, str], line: int, imported: Imported, per_rank: bool
) -> list[str]:
    """Program arguments with the script's own literal variables and SLURM's ids filled in
    (``per_rank``: srun starts a task per rank, so SLURM_PROCID is ``{rank}``). A word still
    reading a shell value is left out and listed, with the option word before it where it is that
    option's value (``--config $X``: ``--config`` alone would take the next word)."""
    out: list[str] = []
    budget = [LINE_LIMIT]
    known = {**variables, **SLURM_VALUES, **(TASK_VALUES if per_rank else {})}
    for at, word in enumerate(words):
        value = substitute(word, known, budget=budget)
        inner_script = at and words[at - 1] == "-c" and SHELL.match(program)  # `bash -c '...$X...'`: its own $
        if not run_time(value) or inner_script or imported.generated:  # a rendered argv is literal
            out.append(value if not inner_script else word)
            continue
        shown = word.replace("\x00", "$(...)")
        paired = not WORDS_OF_ARGUMENTS.match(word) and not word.startswith("-")
        if paired and out and out[-1].startswith("--") and "=" not in out[-1]:
            shown = f"{out.pop()} {shown}"
        imported.unmapped.append(
            Unmapped(line, shown, "a run-time value in an argument: left out", nearest_field(word))
        )
    return out


def defaults_of(words: list[str], variables: dict[str, str]) -> dict[str, str]:
    """``: "${NAME:=value}"``: the literal default each word gives its variable."""
    found = {}
    for word in words:
        match = ASSIGNED_DEFAULT.fullmatch(substitute(word, variables))
        if match and not run_time(match.group(2)):
            found[match.group(1)] = match.group(2)
    return found


def literal_program(program: str, variables: dict[str, str], line: int, imported: Imported) -> str:
    """The program with the script's own variables read in; a run-time value is listed, and
    written with its defaults where it has them (``${1:-/x/bin}``: ``/x/bin``; ``$X`` after
    ``: "${X:=/x}"``: ``/x``), else as ``true``."""
    value = substitute(program, variables)
    if not run_time(value) or imported.generated:
        return value
    defaults = DEFAULT.sub(lambda match: match.group(1), substitute(value, imported.defaults))
    written = defaults if defaults and not run_time(defaults) else "true"
    nearest = SUBMIT_ARGS.split(" (")[0] + " cannot set it" if POSITIONAL.search(value) else "task.script"
    imported.unmapped.append(
        Unmapped(
            line,
            value.replace("\x00", "$(...)"),
            f"a run-time value in the program: {written} written instead",
            f"task.script ({nearest})" if nearest != "task.script" else nearest,
        )
    )
    return written

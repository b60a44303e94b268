"""A batch script's ``#SBATCH`` directives as recipe fields (``clusterkit import``): the options
clusterkit writes itself (:data:`clusterkit.spec.sbatch_header.WRITTEN`) map to the fields behind
them, the rest go to ``resources.extra_sbatch`` with a warning, as ``extra_sbatch`` is checked."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from clusterkit.load.sbatch_checks import DERIVED_SBATCH
from clusterkit.load.script_text import COMPUTED, Command, Unmapped
from clusterkit.load.slurm_options import SBATCH_OPTIONS
from clusterkit.spec.recipe import ARRAY_PATTERN, SBATCH_FLAG_PATTERN, SLURM_TIME_PATTERN

SHORT = {
    "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "A": "account",
    "q": "qos", "J": "job-name", "o": "output", "e": "error", "G": "gpus", "C": "constraint", "D": "chdir",
    "a": "array", "w": "nodelist", "x": "exclude", "d": "dependency", "s": "oversubscribe",
}  # fmt: skip
RESOURCE_TEXT = {"partition", "account", "qos", "constraint", "reservation", "mem"}
LOGS = "runs_dir (clusterkit writes the job's logs to its run directory)"
SIGNALS = ("USR2", "TERM", "HUP", "URG", "USR1")
GPU_COUNT = re.compile(r"^(?:gpu:)?(?:[A-Za-z0-9_.-]+:)?([0-9]+)$")
# `#SBATCH hetjob`: the directives after it are the next component's (packjob: its old name).
HET_SEPARATORS = (["hetjob"], ["packjob"])


@dataclass
class Header:
    """The directives read: flag -> value (None: the flag alone), and what they set."""

    options: dict[str, str | None] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    preemption: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    gpus_per_node: int | None = None
    gpu_request: str = "gres"
    tasks_per_node: int | None = None
    warnings: list[str] = field(default_factory=list)
    unmapped: list[Unmapped] = field(default_factory=list)


def header_groups(directives: list[Command]) -> list[list[Command]]:
    """A heterogeneous job's header groups, split at each ``#SBATCH hetjob`` line (kept first in the
    group it opens, for its line number); one group for any other script. Group 0 is the job's."""
    groups: list[list[Command]] = [[]]
    for directive in directives:
        if directive.words in HET_SEPARATORS:
            groups.append([])
        groups[-1].append(directive)
    return groups


def header_options(directives: list[Command]) -> tuple[dict[str, str | None], dict[str, int]]:
    """Every directive as long flag -> value (a later one wins, as with sbatch), and its line."""
    options: dict[str, str | None] = {}
    lines: dict[str, int] = {}
    for directive in directives:
        words, at = directive.words, 0
        if words in HET_SEPARATORS:
            continue
        while at < len(words):
            word = words[at]
            at += 1
            if word.startswith("--"):
                flag, equals, value = word[2:].partition("=")
                flag = full_option(flag)
                options[flag] = value if equals else None
            elif word.startswith("-") and len(word) > 1:
                flag = SHORT.get(word[1], word[1])
                value = word[2:].lstrip("=") or (words[at] if at < len(words) else None)
                at += 0 if word[2:] else 1
                options[flag] = value
            elif options and lines:  # `--time 1:00:00`: the value of the flag before
                last = next(reversed(options))
                if options[last] is None:
                    options[last] = word
                continue
            else:
                continue
            lines[flag] = directive.line
    return options, lines


def full_option(flag: str) -> str:
    """sbatch's long option ``flag`` abbreviates (``err`` -> ``error``: sbatch takes any unambiguous
    prefix, an exact name first); ``flag`` itself where it is a name, a plugin's or ambiguous."""
    if flag in SBATCH_OPTIONS:
        return flag
    found = [name for name in SBATCH_OPTIONS if name.startswith(flag)] if flag else []
    return found[0] if len(found) == 1 else flag


def ambiguous(flag: str) -> list[str]:
    """The sbatch options ``flag`` abbreviates where it names more than one (sbatch refuses it)."""
    found = sorted(name for name in SBATCH_OPTIONS if name.startswith(flag)) if flag not in SBATCH_OPTIONS else []
    return found if len(found) > 1 else []


def read_header(directives: list[Command]) -> Header:
    header = Header()
    header.options, header.lines = header_options(directives)
    extra: dict[str, Any] = {}
    for flag, value in header.options.items():
        line = header.lines.get(flag, 0)
        if not re.match(SBATCH_FLAG_PATTERN, flag):
            header.unmapped.append(Unmapped(line, f"-{flag}", "no sbatch option name sbatch reads", "resources:"))
        elif ambiguous(flag):
            shown = f"--{flag}" + ("" if value is None else f"={value}")
            why = (
                f"an abbreviation sbatch finds ambiguous (--{', --'.join(ambiguous(flag)[:4])}): it refuses the script"
            )
            header.unmapped.append(Unmapped(line, shown, why, "resources: (the full option name)"))
        elif value is not None and COMPUTED in value:
            header.unmapped.append(Unmapped(line, f"--{flag}", "a computed value", _field(flag)))
        elif flag in DERIVED_SBATCH and not _mapped(header, flag, value, line):
            header.unmapped.append(Unmapped(line, f"--{flag}", "clusterkit derives it", DERIVED_SBATCH[flag]))
        elif flag not in DERIVED_SBATCH and not _mapped(header, flag, value, line):
            extra[flag] = True if value is None else _number(value)
            known = "an sbatch option" if flag in SBATCH_OPTIONS else "no sbatch option clusterkit knows (a plugin's?)"
            header.warnings.append(f"line {line}: --{flag}: {known}, kept in resources.extra_sbatch")
    if extra:
        header.resources["extra_sbatch"] = extra
    if "requeue" not in header.options and "no-requeue" not in header.options:
        header.preemption.update(requeue="site", max_requeues=0)
    if "signal" not in header.options:
        header.preemption["signal"] = False
    return header


def _mapped(header: Header, flag: str, value: str | None, line: int) -> bool:
    """Whether ``flag`` went to a recipe field (or is clusterkit's own); False: extra_sbatch."""
    if flag == "job-name" and value:
        header.name = value
    elif flag == "nodes" and value and value.isdigit():
        header.resources["nodes"] = int(value)
    elif flag == "ntasks-per-node" and value and value.isdigit():
        header.tasks_per_node = int(value)
    elif flag == "cpus-per-task" and value and value.isdigit():
        header.resources["cpus_per_task"] = int(value)
    elif flag in ("gres", "gpus-per-node") and value and GPU_COUNT.match(value.split(",")[0]):
        header.gpus_per_node = int(GPU_COUNT.match(value.split(",")[0]).group(1))  # type: ignore[union-attr]
        header.gpu_request = flag
    elif flag in ("time", "time-min") and value and re.match(SLURM_TIME_PATTERN, value):
        header.resources[flag.replace("-", "_")] = value
    elif flag in RESOURCE_TEXT and value:
        header.resources[flag] = value
    elif flag == "exclusive" and value is None:
        header.resources["exclusive"] = True
    elif flag == "wait-all-nodes" and value == "1":
        header.resources["wait_all_nodes"] = True
    elif flag == "array" and value and re.match(ARRAY_PATTERN, value):
        header.resources["array"] = value
    elif flag in ("requeue", "no-requeue") and value is None:
        header.preemption["requeue"] = flag == "requeue"
        if flag == "no-requeue":
            header.preemption["max_requeues"] = 0
    elif flag == "signal" and value and _signal(header, value):
        pass
    elif flag in ("output", "error", "open-mode"):
        header.unmapped.append(Unmapped(line, f"--{flag}={value}", "not kept: logs go to the run directory", LOGS))
    elif flag == "chdir":
        header.unmapped.append(Unmapped(line, f"--{flag}={value}", "not kept", "the directory you submit from"))
    elif flag == "ntasks" and value and value.isdigit():
        header.tasks_per_node = int(value) // max(1, int(header.options.get("nodes") or 1))
    else:
        return False
    return True


def _signal(header: Header, value: str) -> bool:
    """``[B:]SIG@SECONDS``: the warning signal clusterkit's batch shell receives and passes on."""
    match = re.match(r"^(?:[BR]+:)?(?:SIG)?([A-Z0-9]+)(?:@([0-9]+))?$", value)
    if not match or match.group(1) not in SIGNALS:
        return False
    header.preemption["signal"] = match.group(1)
    if match.group(2) and 10 <= int(match.group(2)) <= 3600:
        header.preemption["grace_s"] = int(match.group(2))
    return True


def _field(flag: str) -> str:
    return f"resources.{flag.replace('-', '_')}" if flag in RESOURCE_TEXT else "resources.extra_sbatch"


def _number(value: str) -> str | int:
    return int(value) if value.isdigit() and len(value) < 10 else value

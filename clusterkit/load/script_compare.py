"""The meaningful parts of a batch script (its #SBATCH options, the environment it exports, its
launch) and the differences between two scripts' parts: a hand-written script and the job
clusterkit renders from its import (``clusterkit import``), or a render and its round trip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterkit.load.import_script import import_script, plan_launch
from clusterkit.load.script_header import header_groups, header_options
from clusterkit.load.script_launch import Launch
from clusterkit.load.script_text import ScriptText, parse_script


@dataclass(frozen=True)
class Parts:
    header: dict[str, str | None]
    env: dict[str, str | None]
    launch: Launch | None


def script_parts(script: ScriptText, launch: Launch | None = None) -> Parts:
    """A script's parts; ``launch``: the one found already (a rendered script's is in its plan)."""
    imported = import_script(script) if launch is None else None
    groups = header_groups(script.directives)
    header, _ = header_options(groups[0])
    for number, group in enumerate(groups[1:], 1):  # a heterogeneous job's components' groups
        header.update({f"{flag} (het group {number})": value for flag, value in header_options(group)[0].items()})
    env = imported.env if imported is not None else _exports(script)
    return Parts(header, env, launch if imported is None else imported.launch)


def rendered_parts(job_sbatch: str, plan: dict[str, Any]) -> Parts:
    """The parts of a job clusterkit rendered: job.sbatch's text and its launch plan."""
    return script_parts(parse_script(job_sbatch, "job.sbatch"), plan_launch(plan))


def _exports(script: ScriptText) -> dict[str, str | None]:
    env: dict[str, str | None] = {}
    for command in script.commands:
        if command.words[:1] == ["export"]:
            for word in command.words[1:]:
                name, equals, value = word.partition("=")
                if equals and not name.startswith("CLUSTERKIT_"):
                    env[name] = value
        elif command.words[:1] == ["unset"]:
            env.update(dict.fromkeys(w for w in command.words[1:] if not w.startswith("CLUSTERKIT_")))
    return env


def differences(original: Parts, rendered: Parts) -> list[str]:
    """Each difference as one line: ``header --time: 1:00:00 -> 01:00:00``, ``env X: only in the script``."""
    lines = _mapping_differences("header --", original.header, rendered.header)
    lines += _mapping_differences("env ", original.env, rendered.env, unset="unset")
    a, b = original.launch, rendered.launch
    if a is None or b is None:
        return lines + ([] if a is b else ["launch: " + ("none in the script" if a is None else "none rendered")])
    for what in ("launcher", "python", "module", "program", "args"):
        if getattr(a, what) != getattr(b, what):
            lines.append(f"launch {what}: {getattr(a, what)} -> {getattr(b, what)}")
    lines += _mapping_differences("launcher option ", _options(a), _options(b))
    lines += _mapping_differences("srun --", dict(a.srun), dict(b.srun))
    return lines


def _options(launch: Launch) -> dict[str, str | None]:
    return {name: value for name, _, value in launch.options}


def _mapping_differences(prefix: str, a: dict[str, Any], b: dict[str, Any], unset: str = "the flag alone") -> list[str]:
    """``unset``: how a None value reads (a flag alone; an unset variable)."""

    def _shown(value: Any) -> str:
        return unset if value is None else str(value).replace("\x00", "$(...)")

    lines = []
    for key in sorted(a.keys() | b.keys()):
        if key not in b:
            lines.append(f"{prefix}{key}: only in the script ({_shown(a[key])})")
        elif key not in a:
            lines.append(f"{prefix}{key}: only in the render ({_shown(b[key])})")
        elif a[key] != b[key]:
            lines.append(f"{prefix}{key}: {_shown(a[key])} -> {_shown(b[key])}")
    return lines

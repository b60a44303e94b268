"""``snapshot:`` resolved at load: which folder a submit copies into the run directory, and where
the script is inside it (the render runs the script from there). The files themselves are listed
when the request is made (:mod:`clusterkit.schedulers.code_snapshot`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from clusterkit.errors import Finding
from clusterkit.load.paths import absolute
from clusterkit.load.yaml_source import SourceMap
from clusterkit.spec.recipe import Recipe
from clusterkit.spec.snapshot import CodeSnapshot, Snapshot

if TYPE_CHECKING:
    import subprocess

KEY = ("snapshot",)


def git(folder: str | Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``git -C folder ...``, read-only: no optional lock taken (concurrent submits never meet on
    index.lock). A missing git is a FileNotFoundError."""
    import subprocess  # here: most recipes take no snapshot, and validating them need not pay ~2 ms

    return subprocess.run(
        ["git", "-C", str(folder), *args],
        capture_output=True,
        check=False,
        env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
    )


def git_root(folder: Path) -> Path | None:
    """The top of the git work tree holding ``folder``; None outside one (or without git)."""
    try:
        done = git(folder, "rev-parse", "--show-toplevel")
    except FileNotFoundError:
        return None
    top = os.fsdecode(done.stdout).rstrip("\n")
    return Path(top) if done.returncode == 0 and top else None


def resolve_snapshot(recipe: Recipe, source: SourceMap) -> tuple[CodeSnapshot | None, list[Finding]]:
    """The snapshot to take, or None; a finding where ``snapshot:`` asks for one that cannot be taken.

    Default on for a script task whose script is a file here (the job would otherwise read the live
    file when it starts); off for the built-in trainer (its code is the installed clusterkit, and
    its settings are already frozen in job.json) and for a module task (``python -m`` imports from
    the job's working directory, which the snapshot does not replace). Asked for explicitly on those,
    or on a script that is not on this machine (a cluster path, a command), it is an error."""
    written = recipe.snapshot
    setting = written if isinstance(written, Snapshot) else Snapshot(enabled=written is not False)
    if not setting.enabled:
        return None, []
    explicit = written is not None
    task = recipe.task

    def refused(message: str) -> tuple[None, list[Finding]]:
        return None, [Finding(source.locate(KEY), KEY, message)] if explicit else []

    if recipe.steps is not None:
        return refused(
            "a snapshot copies one script's code, and a job of several steps runs a script per step: "
            "not with steps: yet (remove snapshot:)"
        )
    if task.trainer is not None:
        return refused(
            "the built-in trainer's code is clusterkit itself and its settings are in job.json: "
            "there is no code of yours to copy (remove snapshot:)"
        )
    if task.program is not None:
        return refused(
            "task.program is run as it is, from where it is (a snapshot copies a script's code "
            "folder); remove snapshot:"
        )
    if task.module:
        return refused(
            "a module task (task.module: true) is imported from the job's working directory, which a "
            "snapshot does not replace; run it as a script file, or set snapshot: false"
        )
    script = Path(task.script or "")
    if not script.is_file():
        return refused(
            f"task.script {task.script} is not a file on this machine, so there is nothing to copy "
            "(set snapshot: false)"
        )
    script = script.absolute()
    if setting.dir is not None:
        root, git = Path(absolute(setting.dir, source, KEY + ("dir",))), False
        if not root.is_dir():
            return None, [Finding(source.locate(KEY + ("dir",)), KEY + ("dir",), f"not a folder: {root}")]
    else:
        found = git_root(script.parent)
        root, git = (found, True) if found is not None else (script.parent, False)
    inside = os.path.relpath(script.resolve(), root.resolve())
    if inside.startswith(".." + os.sep) or inside == "..":
        return None, [
            Finding(
                source.locate(KEY + ("dir",)),
                KEY + ("dir",),
                f"task.script {task.script} is not inside {root}, the folder the snapshot copies",
            )
        ]
    return CodeSnapshot(
        root=str(root), script=inside, git=git, exclude=list(setting.exclude), max_mb=setting.max_mb
    ), []

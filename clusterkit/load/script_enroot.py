"""enroot called directly in a batch script (``clusterkit import``): the ``enroot import`` and
``enroot create`` commands before the launch read back to the image its ``enroot start NAME``
runs (a registry reference or a .sqsh file, the recipe's ``container_image``), the ``enroot
remove`` after it (clusterkit removes its own container), and the start's options compared with
the cluster profile's container. A rendered job's are its launch plan's (``container_setup``).
Words only: nothing runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterkit.load.script_launch import ENROOT_START_BARE, parse_launch
from clusterkit.load.script_text import Unmapped, split_commands
from clusterkit.load.script_values import run_time, substitute
from clusterkit.spec import enroot
from clusterkit.spec.containers import RUNTIMES

if TYPE_CHECKING:
    from clusterkit.load.import_script import Imported
    from clusterkit.load.script_launch import Launch
    from clusterkit.spec.profile import Container

# Each verb's options that take a value (as enroot's usage names them); every other option stands alone.
VALUED = {
    "import": {"-o": "output", "--output": "output", "-a": "arch", "--arch": "arch"},
    "create": {"-n": "name", "--name": "name"},
    "remove": {},
}
IMAGE = "container_image (kept as a hook line)"
CONTAINER_MOUNTS = "the cluster profile's container: mounts"
NOT_GIVEN = "an enroot start option the cluster profile's container does not give"


@dataclass(frozen=True)
class EnrootStep:
    """``import``: ``image`` the registry source, ``target`` the file written ("" where enroot names
    it); ``create``: ``image`` the image file, ``target`` the container's name; ``remove``: ``target``
    the names removed. Values with the script's variables read in."""

    line: int
    text: str
    verb: str
    image: str
    target: str


def enroot_step(line: int, text: str, words: list[str], variables: dict[str, str]) -> EnrootStep | None:
    """The ``enroot import|create|remove`` a command runs (in the batch shell or under srun), or None."""
    parts = split_commands(words)
    launch = parse_launch(line, parts[0], under_srun=True) if len(parts) == 1 else None
    if launch is None or launch.container_runtime or launch.program.rsplit("/", 1)[-1] != "enroot":
        return None
    verb, rest = (launch.args[0], launch.args[1:]) if launch.args else ("", [])
    if verb not in VALUED:
        return None
    options, names = _read([substitute(word, variables) for word in rest], VALUED[verb])
    if verb == "import":
        return EnrootStep(line, text, verb, names[0] if names else "", options.get("output", ""))
    if verb == "create":
        image = names[0] if names else ""
        # enroot's own name for the container: the image file's, without its suffix
        default = next((image[: -len(s)] for s in enroot.SQUASHFS_SUFFIXES if image.endswith(s)), image)
        return EnrootStep(line, text, verb, image, options.get("name") or default.rsplit("/", 1)[-1])
    return EnrootStep(line, text, verb, "", " ".join(names))


def _read(words: list[str], valued: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    at = 0
    while at < len(words) and words[at].startswith("-"):
        if words[at] == "--":
            return options, words[at + 1 :]
        flag, equals, value = words[at].partition("=")
        if flag in valued and not equals:
            value = words[at + 1] if at + 1 < len(words) else ""
            at += 1
        if flag in valued:
            options[valued[flag]] = value
        at += 1
    return options, words[at:]


def start_image(launch: Launch, name: str, out: dict[str, Any], imported: Imported) -> str | None:
    """The image the launch's ``enroot start NAME`` runs (the profile's own where it is the same
    registry image), its import/create/remove steps marked used; None where no step names one,
    where only the shell knows it, or where the profile has no enroot container to take it (the
    steps then stay hook lines). A hand-written start's options are mapped or listed."""
    box = imported.profile.container if imported.profile is not None else None
    if box is None or box.runtime != "enroot":
        return None
    if not imported.generated:
        _start_options(launch, box, out, imported)
    before = [s for s in imported.enroot_steps if s.line < launch.line or imported.generated]
    file, used = name, []
    if not name.endswith(enroot.SQUASHFS_SUFFIXES):
        create = next((s for s in reversed(before) if s.verb == "create" and s.target == name), None)
        if create is None or run_time(create.image):
            return None
        file, used = create.image, [create]
    pulled = next((s for s in reversed(before) if s.verb == "import" and s.target and s.target == file), None)
    image = pulled.image if pulled is not None else file
    if pulled is not None:
        used.append(pulled)
    elif not file.endswith(enroot.SQUASHFS_SUFFIXES):
        return None
    if run_time(image):
        return None
    if pulled is not None and enroot.source(image) == enroot.source(box.image):
        image = box.image  # nvcr.io#nvidia/pytorch:24.05-py3 is docker://nvcr.io#nvidia/pytorch:24.05-py3
    after = [s for s in imported.enroot_steps if s.line > launch.line or imported.generated]
    used += [s for s in after if s.verb == "remove" and name in s.target.split(" ")]
    imported.enroot_used += used
    return image


def _start_options(launch: Launch, box: Container, out: dict[str, Any], imported: Imported) -> None:
    """``--mount SRC:DST`` the profile's container has (whatever its options), ``--env NAME`` (the
    job's variables are passed by name), ``--env NAME=VALUE`` (env, or the profile's GPU option):
    mapped; the others listed."""
    mounts = set()
    for mount in box.mounts:
        source, _, rest = mount.partition(":")
        mounts.add((source, rest.partition(":")[0] or source))
    gpus = RUNTIMES["enroot"].gpus.get(imported.profile.gpu_vendor if imported.profile else "", ())
    words, at = launch.container_options, 0
    while at < len(words):
        flag, equals, value = words[at].partition("=")
        if not equals and flag not in ENROOT_START_BARE and at + 1 < len(words):
            value, at = words[at + 1], at + 1
        at += 1
        shown = flag if flag in ENROOT_START_BARE else f"{flag}={value}"
        if flag in ("--mount", "-m"):
            source, _, rest = value.partition(":")
            if (source, rest.partition(":")[0] or source) not in mounts:
                imported.unmapped.append(
                    Unmapped(launch.line, shown, "a mount the cluster profile's container has not", CONTAINER_MOUNTS)
                )
        elif flag in ("--env", "-e") and "=" in value and f"--env={value}" not in gpus:
            variable, _, literal = value.partition("=")
            if run_time(literal):
                imported.unmapped.append(Unmapped(launch.line, shown, "a run-time value on the launch line", "env"))
            else:
                out.setdefault("env", {})[variable] = literal
        elif flag not in ("--env", "-e"):
            imported.unmapped.append(Unmapped(launch.line, shown, NOT_GIVEN, "container.options in the profile"))


def unused_steps(imported: Imported, recipe: dict[str, Any]) -> None:
    """The steps the launch's image was read from out of the hook lines (mapped); the others
    listed, kept as hook lines."""
    for step in imported.enroot_steps:
        if step in imported.enroot_used:
            for hooks in recipe["hooks"].values():
                if step.text in hooks:
                    hooks.remove(step.text)
            if step.line in imported.kept:
                imported.kept.remove(step.line)
                imported.mapped.append(step.line)
        elif step.verb == "import" and not step.target:
            why = "an enroot import without --output: the file is enroot's to name"
            imported.unmapped.append(Unmapped(step.line, step.text, why, IMAGE))
        elif run_time(step.image or step.target):
            why = f"an enroot {step.verb} of an image only the shell knows"
            imported.unmapped.append(Unmapped(step.line, step.text, why, IMAGE))
        else:
            why = f"an enroot {step.verb} no container of the recipe takes the place of"
            imported.unmapped.append(Unmapped(step.line, step.text, why, IMAGE))

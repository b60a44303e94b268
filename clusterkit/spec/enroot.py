"""NVIDIA's enroot called directly, as job scripts call it without pyxis: the image imported once into
a squashfs file in the run directory (a registry image; a .sqsh file is used where it is), a
container made from it once on each node of the job under a name of the job's own, ``enroot start``
of that container before each task's program, and ``enroot remove`` of it on each node when the job
ends, so that no root filesystem is left on the nodes. :func:`start` is the per-task command
(spec.containers.prefix), :func:`lifecycle` the job's import, create and remove commands (the launch
plan's :class:`~clusterkit.supervisor.plan.ContainerSetup`).

enroot gives the container none of the host's variables by itself, and its ``--env=NAME`` would set an
unset one empty: the variables are named in CLUSTERKIT_CONTAINER_ENV, and clusterkit's configuration
script (``--conf``, supervisor/enroot_environ.sh) passes those that are set. A mount is written
as for every runtime, ``host[:container[:options]]``, and given in enroot's form, its fstab fields
colon-separated: ``--mount=SRC:DST`` (a bind, made where missing), with options
``--mount=SRC:DST:none:x-create=auto,rbind,OPTIONS`` (as pyxis writes it: enroot would read a bare
third field as the filesystem type). enroot reads no space in a mount.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterkit.spec.launchers import Words
from clusterkit.spec.layout import SUPERVISOR_DIR

if TYPE_CHECKING:
    from clusterkit.spec.profile import Container

# The job's container on each node: the job id (an array task's: ARRAY_TASK) makes it the job's own.
CONTAINER_NAME = "clusterkit-{job_id}"
# Where a registry image is imported to, below the run directory: removed with the container.
IMPORTED_IMAGE = "enroot-image.sqsh"
ENV_LIST = "CLUSTERKIT_CONTAINER_ENV"  # the names supervisor/enroot_environ.sh passes
ENVIRON_SCRIPT = "enroot_environ.sh"
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")  # enroot's own image files (not Apptainer's .sif)


@dataclass(frozen=True)
class Lifecycle:
    """The job's enroot commands: ``import_`` (one task; None for an image file), ``create`` and
    ``remove`` (one task per node), and the file ``import_`` writes below the run directory ("" for none)."""

    import_: Words | None
    create: Words
    remove: Words
    imported: str


def mounts(box: Container) -> Words:
    """One --mount per mount (a bare path at its own path), then the run directory at its own."""
    words = Words()
    for mount in box.mounts:
        source, _, rest = mount.partition(":")
        target, _, options = rest.partition(":")
        words.given(
            f"--mount={source}:{target or source}" + (f":none:x-create=auto,rbind,{options}" if options else "")
        )
    return words.runtime("--mount={run_dir}:{run_dir}")


def mount_refusal(mount: str) -> str | None:
    """Why enroot cannot take this mount entry, or None."""
    if any(character.isspace() for character in mount) or mount.count(":") > 2:
        return f"enroot takes host[:container[:options]] without spaces, one mount per entry; {mount!r} is not one"
    return None


def start(box: Container, gpus: tuple[str, ...], env_names: tuple[str, ...]) -> Words:
    """``enroot start`` of the job's container, before a task's program: the variables' names for
    the configuration script, the mounts (the run directory's last), the GPU options, the recipe's
    container.options."""
    words = Words().add("env", f"{ENV_LIST}={' '.join(env_names)}", "enroot", "start")
    words.runtime(f"--conf={{run_dir}}/{SUPERVISOR_DIR}/{ENVIRON_SCRIPT}").extend(mounts(box))
    return words.add(*gpus, *box.options).runtime(CONTAINER_NAME)


def source(image: str) -> str:
    """A registry image as ``enroot import`` reads it: ``docker://[REGISTRY#]IMAGE[:TAG]``."""
    return image if image.startswith("docker://") else "docker://" + image.removeprefix("docker:")


def lifecycle(box: Container, run_dir: str) -> Lifecycle:
    """Import (a registry image, enroot's ``docker://[REGISTRY#]IMAGE[:TAG]``), create (``--force``:
    a requeued job's container of the same name, left by a node that was ended, is made anew), remove."""
    image = Words().given(box.image)
    imported = ""
    import_ = None
    if not box.image.endswith(SQUASHFS_SUFFIXES):
        imported = IMPORTED_IMAGE
        import_ = Words().add("enroot", "import").runtime(f"--output={run_dir}/{imported}").given(source(box.image))
        image = Words().runtime(f"{run_dir}/{imported}")
    create = Words().add("enroot", "create", "--force").runtime(f"--name={CONTAINER_NAME}").add("--").extend(image)
    remove = Words().add("enroot", "remove", "--force", "--").runtime(CONTAINER_NAME)
    return Lifecycle(import_, create, remove, imported)

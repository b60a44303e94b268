"""Container runtimes as data: what each one can run (which kinds of image), how it is given the GPUs
of each vendor, whether the image goes in the ``#SBATCH`` header, and how it is given the job's
environment. :data:`RUNTIMES` is the one table; the recipe checks (:func:`refusal`), the launch plan
(:func:`prefix`) and the header (:func:`header_image`) all read it, so what validates is what runs.

Every runtime mounts the run directory at its own path. pyxis is srun options (launch_plan writes
them); every other runtime is a command before the program, started by the node agent on each node:
apptainer/singularity/shifter pass the host environment through, docker/podman are given each
variable by name (``--env=NAME``: the value comes from the node agent's environment, unset stays unset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clusterkit.spec import enroot
from clusterkit.spec.launchers import Words
from clusterkit.spec.runtime_values import PLACEHOLDER, placeholders

if TYPE_CHECKING:
    from clusterkit.spec.profile import ClusterProfile, Container

RUN_DIR = "{run_dir}"
FILE, FOLDER, REGISTRY, URI = "file", "folder", "registry", "uri"
KIND_WORDS = {
    FILE: "an image file (.sif, .sqsh)",
    FOLDER: "a sandbox folder (a path without an image file's suffix)",
    REGISTRY: "a registry reference (NAME[:TAG], docker://NAME[:TAG])",
    URI: "an Apptainer URI (oras://, library://, shub://, docker-archive:...)",
}
IMAGE_FILE_SUFFIXES = (".sif", ".simg", ".img", ".sqsh", ".squashfs", ".sqfs")
REGISTRY_REFERENCE = re.compile(r"[A-Za-z0-9._/:@#+-]+")
ARCHIVE_PREFIXES = ("docker-archive:", "docker-daemon:", "oci-archive:", "oci:")


@dataclass(frozen=True)
class Runtime:
    name: str
    images: frozenset[str]  # the image kinds it can run
    gpus: dict[str, tuple[str, ...]]  # vendor -> its options; a vendor not named: it cannot give those GPUs
    # srun: options of srun itself (pyxis); exec: Apptainer's command line; run: a container per srun
    # task (docker, podman: --env=NAME each, the host environment does not pass through); shifter: NERSC's.
    style: str
    header_image: bool = False  # the image also goes in #SBATCH --image= (Shifter stages it on the nodes)
    # Its containers are processes of the job (in SLURM's cgroup, with srun's GPU binding); False: a
    # daemon's (docker), or ones given only the variables named, so SLURM's limits and binding do not reach them.
    in_job: bool = True


_DEVICES_AMD = ("--device=/dev/kfd", "--device=/dev/dri", "--group-add=video")
_APPTAINER_GPUS = {"nvidia": ("--nv",), "amd": ("--rocm",)}
_ANY_IMAGE = frozenset({FILE, FOLDER, REGISTRY, URI})
RUNTIMES: dict[str, Runtime] = {
    runtime.name: runtime
    for runtime in (
        Runtime("pyxis", frozenset({FILE, REGISTRY}), {"nvidia": (), "amd": ()}, "srun"),
        Runtime("apptainer", _ANY_IMAGE, _APPTAINER_GPUS, "exec"),
        Runtime("singularity", _ANY_IMAGE, _APPTAINER_GPUS, "exec"),
        Runtime("docker", frozenset({REGISTRY}), {"nvidia": ("--gpus=all",), "amd": _DEVICES_AMD}, "run", in_job=False),
        # A folder: podman --rootfs. NVIDIA's GPUs through their CDI spec (nvidia-ctk cdi generate).
        Runtime(
            "podman",
            frozenset({REGISTRY, FOLDER}),
            {"nvidia": ("--device=nvidia.com/gpu=all",), "amd": _DEVICES_AMD},
            "run",
            in_job=False,
        ),
        # NERSC's Shifter: images come from its gateway (shifterimg pull), NVIDIA's GPUs from its gpu module.
        Runtime("shifter", frozenset({REGISTRY}), {"nvidia": ("--module=gpu",)}, "shifter", header_image=True),
        # NVIDIA's enroot called directly (as pyxis calls it): a registry image imported into a .sqsh once,
        # a container made from it once per node, `enroot start` per task (spec.enroot). NVIDIA's GPUs come
        # through its nvidia hook (NVIDIA_VISIBLE_DEVICES), SLURM's binding through CUDA_VISIBLE_DEVICES;
        # it has no AMD hook.
        Runtime(
            "enroot",
            frozenset({FILE, REGISTRY}),
            {"nvidia": ("--env=NVIDIA_VISIBLE_DEVICES=all",)},
            "enroot",
        ),
    )
}

# What every docker/podman container is given by name: SLURM's task variables, the rendezvous and rank
# variables, and what clusterkit's own runner and supervisor read (PYTHONPATH: the stack-dump site folder).
PASSED_ENV = (
    *(
        f"SLURM_{name}"
        for name in (
            "JOB_ID JOB_NAME JOB_NODELIST JOB_NUM_NODES NNODES NODELIST NODEID PROCID LOCALID NTASKS "
            "NTASKS_PER_NODE TASKS_PER_NODE CPUS_PER_TASK CPUS_ON_NODE STEP_ID STEP_NODELIST STEP_NUM_NODES "
            "STEP_NUM_TASKS ARRAY_JOB_ID ARRAY_TASK_ID RESTART_COUNT SUBMIT_DIR GPUS_ON_NODE"
        ).split()
    ),
    "SLURMD_NODENAME",
    *"MASTER_ADDR MASTER_PORT NODE_RANK RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE".split(),
    *(
        f"CLUSTERKIT_{name}"
        for name in (
            "JOB_ID RUN_DIR RETRY RETRY_OF HEARTBEAT STACKS_DIR STACKS_CLAIMED PREEMPTED PREEMPT_SIGNAL "
            "EXECUTOR COLLECTIVE_TIMEOUT_S PREFLIGHT_SLOW_RANK TRACKING TRACKING_DIR TRACKING_RUN_ID STEP TRIAL"
        ).split()
    ),
    "RUN_DIR",
    "PYTHONPATH",
)


def image_kind(image: str) -> str:
    """What an image names: a registry reference (docker://NAME, Shifter's docker:NAME, or a bare
    NAME[:TAG]), another Apptainer URI (oras://, docker-archive:...), a file (by its suffix), or a
    sandbox folder (a path, not a file's: starting with / . ~ or ending with /)."""
    if image.startswith("docker:"):  # docker:// and Shifter's docker: (not docker-archive:)
        return REGISTRY
    if "://" in image or image.startswith(ARCHIVE_PREFIXES):
        return URI
    if image.endswith(IMAGE_FILE_SUFFIXES):
        return FILE
    return FOLDER if image.startswith(("/", ".", "~")) or image.endswith("/") else REGISTRY


def registry_name(image: str) -> str:
    """A registry reference without its docker:// (or Shifter's docker:) prefix."""
    return image.removeprefix("docker://").removeprefix("docker:")


def refusal(box: Container, profile: ClusterProfile) -> tuple[tuple[str, ...], str] | None:
    """Why this container cannot run on this profile (the profile's key, the message), or None."""
    runtime = RUNTIMES[box.runtime]
    if placeholders(box.image) and runtime.header_image:
        return ("container", "image"), (
            f"{box.runtime} stages its image before the job starts, where no run-time value is known: "
            f"write {box.image!r} out"
        )
    # A run-time value ({env:CONT}) is filled in on the node: the text around it is what can be checked.
    image = PLACEHOLDER.sub("x", box.image)
    kind = image_kind(image)
    if box.image.startswith("-"):
        return ("container", "image"), f"{box.image} starts with '-', which {box.runtime} would read as an option"
    if kind == REGISTRY and not REGISTRY_REFERENCE.fullmatch(image):
        return ("container", "image"), (
            f"{box.image!r} is not a registry reference: letters, digits and . _ - / : @ # only "
            "(a file or folder: give its path, starting with / or ./)"
        )
    if kind not in runtime.images:
        takes = " or ".join(KIND_WORDS[k] for k in sorted(runtime.images))
        return ("container", "image"), f"{box.runtime} cannot run {KIND_WORDS[kind]} ({box.image}); it runs {takes}"
    if profile.accelerator == "gpu" and profile.gpu_vendor not in runtime.gpus:
        able = ", ".join(name for name, other in RUNTIMES.items() if profile.gpu_vendor in other.gpus)
        return ("container", "runtime"), f"{box.runtime} cannot give a container {profile.gpu_vendor} GPUs; use {able}"
    if profile.task_gpu_bind is not None and not runtime.in_job:
        return ("task_gpu_bind",), (
            f"SLURM's per-task GPU binding does not reach a {box.runtime} container, which sees every GPU of "
            "the node; leave task_gpu_bind out (the ranks pick their GPU by LOCAL_RANK)"
        )
    if runtime.style == "srun" and box.options:
        return ("container", "options"), "pyxis takes srun's options: give them in the recipe's srun.extra"
    if runtime.style == "enroot" and kind == FILE and not image.endswith(enroot.SQUASHFS_SUFFIXES):
        return ("container", "image"), f"enroot runs a squashfs image (.sqsh) or a registry image, not {box.image}"
    if runtime.style == "enroot" and box.workdir:
        return ("container", "workdir"), (
            "enroot has no working-directory option (a task starts in its own directory where the image "
            "has it): leave container.workdir out"
        )
    for index, mount in enumerate(box.mounts if runtime.style == "enroot" else ()):
        why = enroot.mount_refusal(mount)
        if why is not None:
            return ("container", "mounts", index), why
    if runtime.style in ("run", "shifter", "enroot"):
        for index, mount in enumerate(box.mounts):
            source = mount.split(":")[0]
            if "," in mount or not source.startswith("/"):
                return ("container", "mounts", index), (
                    f"{box.runtime} takes one mount per entry, from an absolute host path "
                    f"(/host[:/container[:options]]); {mount!r} is not one"
                )
    return None


def header_image(box: Container | None) -> str | None:
    """The image Shifter stages on the nodes before the job (#SBATCH --image=)."""
    if box is None or not RUNTIMES[box.runtime].header_image:
        return None
    return "docker:" + registry_name(box.image)


def prefix(box: Container, profile: ClusterProfile, name: str, env_names: tuple[str, ...]) -> Words:
    """The command before the program on each node (not pyxis: its are srun options): the runtime,
    its options, the recipe's container.options, the image. ``name``: a docker/podman container's
    (run-time values allowed), ``env_names``: the variables it is given."""
    runtime = RUNTIMES[box.runtime]
    gpus = runtime.gpus.get(profile.gpu_vendor, ()) if profile.accelerator == "gpu" else ()
    if runtime.style == "exec":
        # One --bind each, so that each mount is one word: its own run-time values ({env:SCRATCH}) filled in.
        words = Words().add(box.runtime, "exec", *gpus)
        for mount in box.mounts:
            words.add("--bind").given(mount)
        words.add("--bind").runtime(RUN_DIR)
        if box.workdir:
            words.add("--pwd").given(box.workdir)
        words.add(*box.options)
        # A bare name is Apptainer's to read (a relative path, as it always was); Shifter's docker:NAME is docker://.
        return words.given("docker://" + registry_name(box.image) if box.image.startswith("docker:") else box.image)
    if runtime.style == "enroot":
        # SLURM's GPU binding, where it set one (not a variable every runtime needs: apptainer's pass through).
        cuda = ("CUDA_VISIBLE_DEVICES",) if gpus else ()
        return enroot.start(box, gpus, (*env_names, *cuda))
    if runtime.style == "shifter":
        words = Words().add("shifter", f"--image={header_image(box)}", *gpus).extend(_volumes(box))
        return words.given(*((f"--workdir={box.workdir}",) if box.workdir else ())).add(*box.options)
    # docker/podman run: --rm removes the container when the client returns, --init passes signals on.
    words = Words().add(box.runtime, "run", "--rm", "--init", "--network=host", "--ipc=host").runtime(f"--name={name}")
    # The user's own files in the run directory: docker runs as the user's ids, rootless podman maps them.
    if box.runtime == "docker":
        words.runtime("--user={uid}:{gid}")
    else:
        words.add("--userns=keep-id")
    words.add(*gpus).extend(_volumes(box))
    if box.workdir:
        words.given(f"--workdir={box.workdir}")
    else:
        words.runtime(f"--workdir={RUN_DIR}")
    words.add(*(f"--env={variable}" for variable in env_names), *box.options)
    if image_kind(box.image) == FOLDER:
        return words.add("--rootfs").given(box.image)
    return words.given(registry_name(box.image))


def _volumes(box: Container) -> Words:
    """One --volume per mount; a bare path at its own path (docker's -v /path alone is an empty volume)."""
    volumes = (mount if ":" in mount else f"{mount}:{mount}" for mount in box.mounts)
    return Words().given(*(f"--volume={volume}" for volume in volumes)).runtime(f"--volume={RUN_DIR}:{RUN_DIR}")

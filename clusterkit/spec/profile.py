"""Cluster profiles: what ops teams know about a cluster, kept in YAML beside the recipes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, Union

from msgspec import Meta, field

import clusterkit.recipes.clusters
from clusterkit.spec.recipe import (
    END,
    LINE_BREAKING,
    PATTERN_HINTS,
    WORD_PATTERN,
    EnvMap,
    Line,
    Memory,
    NetworkProfileName,
    NonEmptyLine,
    PositiveInt,
    PythonCommand,
    SlurmTime,
    _Struct,
)

BUILTIN_CLUSTERS_DIR = Path(clusterkit.recipes.clusters.__file__).parent

# The same folder on the login node (prefetch) and in every rank: absolute, and without the braces of
# the env placeholders ({job_id}, {rank}) that would make it differ per job.
HF_HOME_PATTERN = rf"^/[^{LINE_BREAKING}{{}}]*{END}"
PATTERN_HINTS[HF_HOME_PATTERN] = "an absolute path (starting with /) on one line, without { or }"
# A container runtime's option: one word starting with '-' (a value joined with '='), on one line.
RUNTIME_OPTION_PATTERN = rf"^-[^\s{LINE_BREAKING}]+{END}"
PATTERN_HINTS[RUNTIME_OPTION_PATTERN] = "one word starting with '-' (--flag or --flag=value), without spaces"


class GPU(_Struct):
    model: NonEmptyLine
    memory_gb: Annotated[float, Meta(gt=0)]
    # Dense bf16 peak per GPU; used by the planner's cost model.
    peak_tflops: Annotated[float, Meta(gt=0)] | None = None
    # Whose GPUs: how a container runtime exposes them (Apptainer's --nv or --rocm).
    vendor: Literal["nvidia", "amd"] = "nvidia"


class Container(_Struct):
    """Run the job's steps inside a container (each node's launcher or each rank, the service, the
    preflight). ``runtime``: pyxis/enroot (srun --container-image & co.); apptainer or singularity
    (``exec`` before the launcher, ``--nv`` or ``--rocm`` by the profile's GPU vendor); docker or
    podman (``run`` a container per node: host network and IPC, the GPUs, the user's ids, each job
    variable by name); shifter (NERSC: the image in ``#SBATCH --image=`` and ``shifter`` per node,
    ``--module=gpu``); enroot called directly (import, create once per node, ``enroot start`` per task,
    remove at the end: spec.enroot). ``image``: a file (.sif, .sqsh), a registry reference (NAME[:TAG] or
    docker://NAME[:TAG]) or a sandbox folder, as the runtime can run it (spec.containers says which).
    The run directory is always mounted at its own path."""

    image: NonEmptyLine
    runtime: Literal["pyxis", "apptainer", "singularity", "docker", "podman", "shifter", "enroot"] = "pyxis"
    # host[:container[:options]], as the runtimes write them (docker, podman, shifter: one per entry)
    mounts: list[NonEmptyLine] = field(default_factory=list)
    workdir: NonEmptyLine | None = None
    # pyxis runs every task inside the image, clusterkit's node agent too: the image's interpreter for
    # it (any Python 3.8 or newer). Every other runtime's agent runs outside, with the profile's host_python.
    python: Annotated[str, Meta(pattern=WORD_PATTERN)] = "python3"
    # More of the runtime's own options, each one word before the image, e.g. --device=/dev/infiniband
    # or --security-opt=label=disable (not pyxis: its are srun.extra).
    options: list[Annotated[str, Meta(pattern=RUNTIME_OPTION_PATTERN)]] = field(default_factory=list)


# A host name, address or ~/.ssh/config alias, and a login name, as ssh takes them: never an ssh
# option (no leading "-"), no spaces, quotes or shell characters. ProxyJump: [user@]host[:port], commas.
SSH_HOST = r"[A-Za-z0-9_.:\[\]][A-Za-z0-9_.:\[\]-]{0,252}"
SSH_USER = r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}"
SSH_HOP = f"(?:{SSH_USER}@)?{SSH_HOST}"
SSHHost = Annotated[str, Meta(pattern=f"^{SSH_HOST}{END}")]
SSHUser = Annotated[str, Meta(pattern=f"^{SSH_USER}{END}")]
SSHJump = Annotated[str, Meta(pattern=f"^{SSH_HOP}(?:,{SSH_HOP})*{END}")]
PATTERN_HINTS[f"^{SSH_HOST}{END}"] = (
    "a host name, address or ~/.ssh/config alias: letters, digits, '.', '_', ':', "
    "'[', ']' and '-' (not first), no spaces or shell characters"
)
PATTERN_HINTS[f"^{SSH_USER}{END}"] = "a login name: letters, digits, '.', '_' and '-' (not first)"
PATTERN_HINTS[f"^{SSH_HOP}(?:,{SSH_HOP})*{END}"] = (
    "[user@]host[:port], comma-separated for a chain of jump hosts (as ssh -J)"
)
# OpenSSH's ControlPersist: no (no master: every remote command signs in anew), yes (until the master is stopped) or a time
# such as 10m or 1h30m (a bare number: seconds) after the last command. YAML reads an unquoted yes/no as true/false.
CONTROL_PERSIST_PATTERN = rf"^(?:no|yes|(?:\d+[smhdwSMHDW]?)+){END}"
PATTERN_HINTS[CONTROL_PERSIST_PATTERN] = "no, yes, a number of seconds, or a time such as 10m or 1h30m"
ControlPersist = Union[bool, Annotated[int, Meta(ge=0)], Annotated[str, Meta(pattern=CONTROL_PERSIST_PATTERN)]]


def control_persist_option(value: ControlPersist) -> str:
    """The value as ssh's ``-o ControlPersist=`` takes it."""
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


class Login(_Struct):
    """The login node that ``clusterkit submit`` reaches over SSH from a laptop. ``host`` may be an
    alias from ~/.ssh/config: its settings are resolved as OpenSSH resolves them (``ssh -G``:
    ``Include``, ``Match``, ``ProxyCommand``, certificates); a field set here wins over the config,
    as a command-line option does for ssh.

    ``transport``: ``openssh`` runs the system ``ssh``, which keeps one authenticated master
    connection (ControlMaster) for ``control_persist`` after the last command, so a second factor is
    asked once per session, not once per clusterkit command; ``paramiko`` (``pip install
    clusterkit[ssh]``) signs in anew for every command and refuses, by name, the settings it cannot
    honour; ``auto`` is ``openssh`` where ``ssh`` is on PATH, ``paramiko`` otherwise."""

    host: SSHHost
    port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    user: SSHUser | None = None
    identity_file: NonEmptyLine | None = None
    # [user@]host[:port], comma-separated for a chain of bastions, as ssh's -J.
    proxy_jump: SSHJump | None = None
    transport: Literal["auto", "openssh", "paramiko"] = "auto"
    control_persist: ControlPersist = "10m"
    # Where uploaded runs live on the cluster: runs_dir and task scripts are relative to it.
    remote_workdir: NonEmptyLine = "clusterkit"
    # The interpreter that runs clusterkit on the login node (when installed there): one word.
    python: Annotated[str, Meta(pattern=WORD_PATTERN)] = "python3"


class ClusterProfile(_Struct, kw_only=True):
    name: NonEmptyLine
    description: str | None = None
    # cpu: processes stand in for GPUs, the gloo backend is used and no GPU is requested.
    accelerator: Literal["gpu", "cpu"] = "gpu"
    gpu: GPU | None = None
    gpus_per_node: PositiveInt
    # How this site's SLURM wants GPUs asked for.
    gpu_request: Literal["gres", "gpus-per-node", "none"] = "gres"
    cpus_per_node: PositiveInt
    mem_per_node: Memory | None = None
    partition: NonEmptyLine | None = None
    account: NonEmptyLine | None = None
    qos: NonEmptyLine | None = None
    max_time: SlurmTime | None = None
    interconnect: NetworkProfileName
    # Bandwidth in GB/s per GPU, for the planner's cost model.
    intra_node_gbps: Annotated[float, Meta(gt=0)] | None = None
    inter_node_gbps: Annotated[float, Meta(gt=0)] | None = None
    network_env: EnvMap = field(default_factory=dict)
    modules: list[NonEmptyLine] = field(default_factory=list)
    setup: list[Line] = field(default_factory=list)
    env: EnvMap = field(default_factory=dict)
    container: Container | None = None
    # SLURM's --gpu-bind for launch steps that run one srun task per rank (launcher python, DeepSpeed's
    # batch-shell srun), e.g. single:1 (each task sees only its GPU), closest, map_gpu:0,1,2,3. Not
    # given to a step whose task starts a whole node's ranks (torchrun, DeepSpeed per node, mpirun).
    task_gpu_bind: Annotated[str, Meta(pattern=WORD_PATTERN)] | None = None
    runs_dir: NonEmptyLine | None = None
    # The launchers' and ranks' interpreter (the one with torch), one word or an argv list; a recipe's
    # python wins. Not the supervisor's: that is host_python.
    python: PythonCommand = "python3"
    # The interpreter of clusterkit's supervisor in the batch shell, and of its node agent on each node
    # where that runs outside a container (no container, or Apptainer): any Python 3.8 or newer, looked
    # up after the setup lines (so a module or venv they load can provide it).
    host_python: Annotated[str, Meta(pattern=WORD_PATTERN)] = "python3"
    nvme_path: NonEmptyLine | None = None
    login: Login | None = None
    # Compute nodes that cannot reach the model hub: jobs run with the hub's offline switches set
    # (spec.network's hub layer) and read models from hf_home, filled by `clusterkit prefetch` on the login node.
    offline: bool = False
    # HF_HOME for every job: an absolute path on the shared filesystem (the hub cache is its hub/ folder).
    hf_home: Annotated[str, Meta(pattern=HF_HOME_PATTERN)] | None = None

    @property
    def gpu_vendor(self) -> str:
        return self.gpu.vendor if self.gpu is not None else "nvidia"


def expanded(text: str) -> Path:
    """``~`` and ``~user`` expanded; a ``~user`` with no such user stays as written (and is then
    simply not found) instead of raising from pathlib."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


CLUSTERS_ENV = "CLUSTERKIT_CLUSTERS"  # colon-separated ops directories of cluster profiles


def profile_search_path(recipe_dir: Path, user_dirs: Sequence[Path] = ()) -> list[Path]:
    """Where ``cluster: NAME`` is looked up, first match wins: $CLUSTERKIT_CLUSTERS, ``clusters/``
    beside the recipe, ``user_dirs`` (the user config's profile_dirs), then the profiles shipped
    with clusterkit."""
    extra = [Path(p) for p in os.environ.get(CLUSTERS_ENV, "").split(os.pathsep) if p]
    return [*extra, recipe_dir / "clusters", *user_dirs, BUILTIN_CLUSTERS_DIR]


def find_profile(reference: str, recipe_dir: Path, user_dirs: Sequence[Path] = ()) -> Path | None:
    """Resolve a ``cluster:`` value: a path (relative to the recipe) or a profile name."""
    if "/" in reference or reference.endswith((".yaml", ".yml")):
        path = expanded(reference)
        path = path if path.is_absolute() else recipe_dir / path
        return path if path.is_file() else None
    for directory in profile_search_path(recipe_dir, user_dirs):
        for suffix in (".yaml", ".yml"):
            candidate = directory / f"{reference}{suffix}"
            if candidate.is_file():
                return candidate
    return None


def available_profiles(recipe_dir: Path, user_dirs: Sequence[Path] = ()) -> list[str]:
    names = set()
    for directory in profile_search_path(recipe_dir, user_dirs):
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.y*ml"))
    return sorted(names)

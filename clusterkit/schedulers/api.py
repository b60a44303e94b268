"""The scheduler interface, its registry and submission as ``schedule(dry_run(...))`` (torchx's shape).

:func:`dry_run` builds the exact, immutable request: the files, where they are written, and the
argv that submits them. A scheduler adapter only carries it out: ``clusterkit submit --dry-run``
prints the request's script and argv, and those are what reach ``sbatch``. Adapters are looked up
by the name a run record carries, so ``status``, ``logs`` and ``cancel`` find the adapter that
submitted the run without the caller choosing one.
"""

from __future__ import annotations

import dataclasses
import importlib
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, BinaryIO, Protocol

from clusterkit.errors import FileSystemError, PathError, UserError, is_users_path_error
from clusterkit.runs.logs import Readable
from clusterkit.runs.node_choice import NodeChoice
from clusterkit.runs.record import RunRecord, TrackedRun
from clusterkit.runs.status import JobStatus
from clusterkit.schedulers.code_snapshot import Inventory, take_inventory
from clusterkit.spec.arrays import array_indices, task_job_id
from clusterkit.spec.layout import JOB_SCRIPT, LOCAL_JOB_IDS, STAGING_PREFIX, TRACKING_DIR
from clusterkit.spec.profile import ClusterProfile, Login
from clusterkit.spec.tracking import Tracking

if TYPE_CHECKING:  # status, ls, logs and cancel need neither the loader (YAML) nor the renderer (Jinja)
    from clusterkit.load.loader import LoadedRecipe
    from clusterkit.render.job import RenderedJob

JOB_ID_FIELD = "{job_id}"  # in the local executor's argv: the id it claims when it submits


@dataclass(frozen=True)
class SubmitRequest:
    scheduler: str  # the registry name of the adapter that sends it
    name: str
    recipe: str
    # <runs_dir>/<name>: the run directory is <job id> below it. For ssh, relative to the login
    # node's remote_workdir (where sbatch runs) unless runs_dir is absolute.
    runs_root: str
    # <runs_root>/.staging-<token>: the files are written here and submitted from here, then the
    # directory is renamed to the job id.
    staging: str
    argv: tuple[str, ...]  # the command that submits (or, locally, runs) the script, word for word
    files: Mapping[str, str]  # file name -> text, the job script among them
    nodes: int  # training's
    ranks_per_node: int
    launcher: str
    overrides: tuple[str, ...] = ()
    spare_nodes: int = 0  # allocated beside training's (resources.spare_nodes)
    runs_dir: str = "./runs"  # as the recipe says it
    login: Login | None = None  # ssh: the login node
    # Local task scripts the login node needs, relative paths kept (the job runs in remote_workdir).
    uploads: tuple[str, ...] = ()
    script_name: str = JOB_SCRIPT  # the file among ``files`` that argv submits
    tasks: tuple[int, ...] = ()  # a job array's task indices: each gets <run dir>/<index>/ and a record
    task_overrides: tuple[tuple[str, ...], ...] = ()  # a sweep: each task's overrides (its point's values)
    array_throttle: int | None = None  # the array's %N: at most N tasks at once
    links: int = 0  # a chain (an array run one task at a time in one run directory): its links
    cluster: str | None = None  # the cluster profile's name, kept in the run record
    tracking: TrackedRun | None = None  # its dir, for a fresh run: empty (<run dir>/tracking once known)
    # The recipe's secrets: names only; the adapter reads their values when it submits (secret_values).
    secrets: tuple[str, ...] = ()
    snapshot: Inventory | None = None  # the code copied into <run dir>/code (layout.SNAPSHOT_DIR)

    @property
    def script(self) -> str:
        return self.files[self.script_name]

    def records(self, job_id: str, run_dir: str, submitted_at: float, pid: int | None = None) -> list[RunRecord]:
        """The run records of this request once submitted as ``job_id``: the job's, then, for a job
        array, each task's (in ``<run_dir>/<index>``, job id ``<job_id>_<index>``)."""
        job = RunRecord(
            job_id=job_id,
            name=self.name,
            scheduler="slurm" if self.scheduler == "ssh" else self.scheduler,
            run_dir=run_dir,
            recipe=self.recipe,
            submitted_at=submitted_at,
            nodes=self.nodes,
            spare_nodes=self.spare_nodes,
            ranks_per_node=self.ranks_per_node,
            launcher=self.launcher,
            pid=pid,
            overrides=self.overrides,
            tasks=self.tasks,
            links=self.links,
            cluster=self.cluster,
            tracking=self.tracking
            and dataclasses.replace(self.tracking, dir=self.tracking.dir or f"{run_dir}/{TRACKING_DIR}"),
            **(
                {
                    "code_from": self.snapshot.root,
                    "code_commit": self.snapshot.commit,
                    "code_dirty": self.snapshot.dirty,
                }
                if self.snapshot
                else {}
            ),
        )
        return [
            job,
            *(
                dataclasses.replace(
                    job,
                    job_id=task_job_id(job_id, index),
                    run_dir=f"{run_dir}/{index}",
                    tasks=(),
                    overrides=self.task_overrides[k] if self.task_overrides else self.overrides,
                )
                for k, index in enumerate(self.tasks)
            ),
        ]


class Scheduler(Protocol):
    """An adapter: sends a request and answers for the runs it submitted."""

    def submit(self, request: SubmitRequest) -> RunRecord: ...

    def status(self, record: RunRecord) -> JobStatus: ...

    def statuses(self, records: list[RunRecord]) -> list[JobStatus]:
        """Each run's status, asking the scheduler once for all of them (never once per run)."""

    def cancel(self, record: RunRecord) -> None: ...

    def logs(self, record: RunRecord, rank: int | None, follow: bool, out: BinaryIO | None = None) -> int:
        """Write the run's logs (one rank's, with ``rank``) to ``out`` (default stdout), as they grow
        with ``follow``; the exit code."""

    def run_file(self, record: RunRecord, name: str) -> Readable:
        """A file of the run directory, wherever the run lives."""

    def ask_stacks(self, record: RunRecord) -> None:
        """Ask the running job's supervisor to take every rank's stacks (it writes STACKS_SUMMARY)."""

    def exec(self, record: RunRecord, choice: NodeChoice, command: Sequence[str], tty: bool = False) -> int:
        """Run ``command`` (argv, no shell) on one node of the running job, inside its allocation,
        with this terminal's input and output (``tty``: a terminal of its own); its exit status."""


# name -> the module whose ``open_scheduler(login, accept_new_host_key)`` context gives the adapter;
# imported on first use, so a local run never imports paramiko.
REGISTRY = {
    "slurm": "clusterkit.schedulers.slurm",
    "local": "clusterkit.schedulers.local",
    "ssh": "clusterkit.schedulers.ssh",
}


def open_scheduler(
    name: str, login: Login | None = None, accept_new_host_key: bool = False
) -> AbstractContextManager[Scheduler]:
    """The adapter registered as ``name``, for as long as the ``with`` block (an SSH connection is
    opened once and closed at its end)."""
    return importlib.import_module(REGISTRY[name]).open_scheduler(login, accept_new_host_key)


def login_of(record: RunRecord) -> Login | None:
    import msgspec

    return msgspec.convert(record.login, Login) if record.login is not None else None


def default_scheduler(profile: ClusterProfile) -> str:
    """Where the cluster is, not merely what this machine has: over SSH when the profile names a
    login node that is not this host (an ``sbatch`` here would queue the job on another cluster:
    this machine's); else SLURM where ``sbatch`` is on PATH; else the local executor. ``--executor
    slurm`` still submits here."""
    if profile.login and not is_this_host(profile.login.host):
        return "ssh"
    if shutil.which("sbatch"):
        return "slurm"
    return "ssh" if profile.login else "local"


def is_this_host(name: str) -> bool:
    """Whether a login node's name is this machine's (its host name or FQDN, short or full). An
    address such as 127.0.0.1 or localhost is not taken as this host: with a port it is often a
    tunnel to the cluster (ssh -L), and SSH reaches it either way."""
    import socket

    wanted = name.lower().rstrip(".")
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    return wanted in names or wanted in {full.split(".")[0] for full in names}


class SchedulerUnavailable(UserError, LookupError):
    """The chosen executor cannot reach this cluster, or cannot run this job (exit 2)."""


# What a job may ask of its scheduler: feature -> whether this job does (``dependency``: submit's
# --after/--singleton). What a scheduler cannot do is data on its module: ``UNSUPPORTED`` (feature ->
# why, formatted with the recipe) and ``MAX_NODES``, read here and nowhere else.
JOB_FEATURES: dict[str, Callable[[LoadedRecipe, str | None], bool]] = {
    # (a front end of yours, launcher command, runs the srun on its PATH: the local executor's stand-in too)
    "batch_launcher": lambda loaded, dependency: (
        loaded.recipe.process_model == "batch_launcher" and loaded.recipe.launcher != "command"
    ),
    "dependency": lambda loaded, dependency: bool(dependency),
    "service": lambda loaded, dependency: loaded.recipe.service is not None,
    "components": lambda loaded, dependency: bool(loaded.recipe.components),
    "pyxis": lambda loaded, dependency: bool(loaded.recipe.container and loaded.recipe.container.runtime == "pyxis"),
}


def check_capabilities(loaded: LoadedRecipe, scheduler: str, dependency: str | None = None) -> None:
    """Refuse, in one line, a job that asks for what ``scheduler`` cannot do."""
    backend = importlib.import_module(REGISTRY[scheduler])
    for feature, asks in JOB_FEATURES.items():
        if feature in backend.UNSUPPORTED and asks(loaded, dependency):
            raise SchedulerUnavailable(f"{loaded.path}: {backend.UNSUPPORTED[feature].format(recipe=loaded.recipe)}")
    nodes = loaded.recipe.resources.nodes + loaded.recipe.resources.spare_nodes
    if backend.MAX_NODES is not None and nodes > backend.MAX_NODES:
        raise SchedulerUnavailable(
            f"{loaded.path}: resources.nodes: the {scheduler} executor runs at most {backend.MAX_NODES} nodes "
            f"({backend.NODES}), not {nodes}{' with the spares' if loaded.recipe.resources.spare_nodes else ''}"
        )


def dry_run(
    loaded: LoadedRecipe, job: RenderedJob, scheduler: str | None = None, dependency: str | None = None
) -> SubmitRequest:
    """The exact request: files, where they go, and the argv that submits them (``dependency``:
    sbatch's --dependency, from submit --after/--singleton)."""
    recipe, profile = loaded.recipe, loaded.profile
    scheduler = scheduler or default_scheduler(profile)
    runs_dir = recipe.runs_dir or "./runs"
    uploads: tuple[str, ...] = ()
    if scheduler == "ssh":
        if profile.login is None:
            raise SchedulerUnavailable(
                f"{loaded.profile_path}: cluster profile {profile.name!r} names no login "
                f"node (login: {{host: ...}}), so it cannot be reached over SSH"
            )
        runs_root = str(PurePosixPath(runs_dir) / recipe.name)  # the login node expands it, in remote_workdir
        script = recipe.task.script
        if (
            script
            and not recipe.task.module
            and not recipe.snapshot
            and not PurePosixPath(script).is_absolute()
            and Path(script).is_file()
        ):
            uploads = (script,)
    else:
        runs_root = str(Path(runs_dir).expanduser().absolute() / recipe.name)
    check_capabilities(loaded, scheduler, dependency)
    staging = f"{runs_root}/{STAGING_PREFIX}{secrets.token_hex(6)}"
    # Listed now, so what the dry run reports is what the submit copies; the local runs_dir (an ssh
    # run's records too) is never part of it.
    local_runs = Path(runs_dir).expanduser().absolute()
    runs = (local_runs, local_runs / recipe.name, local_runs / LOCAL_JOB_IDS)  # with runs_dir: . the last two count
    # The user's secrets file is never code, even kept untracked beside it: a copy would outlive the job.
    from clusterkit.load.user_config import load_user_config

    secrets_file = load_user_config().secrets_path() if recipe.snapshot else None
    snapshot = (
        take_inventory(recipe.snapshot, (*runs, *([secrets_file] if secrets_file else []))) if recipe.snapshot else None
    )
    if scheduler == "local":
        argv: tuple[str, ...] = ("bash", f"{runs_root}/{JOB_ID_FIELD}/{job.script_name}")
    else:
        # Held until the run directory is in place: SLURM creates no folders for --output. The secrets
        # are not in sbatch's environment (SLURM would store it with the job): the job reads them from its file.
        unset = tuple(word for name in recipe.secrets for word in ("-u", name))
        argv = (
            *(("env", *unset) if unset else ()),
            "sbatch",
            "--parsable",
            "--hold",
            *([f"--dependency={dependency}"] if dependency else []),
            f"{staging}/{job.script_name}",
        )
    return SubmitRequest(
        scheduler=scheduler,
        name=recipe.name,
        recipe=str(loaded.path.absolute()),
        runs_root=runs_root,
        staging=staging,
        argv=argv,
        files=MappingProxyType(dict(job.files)),
        nodes=recipe.resources.nodes,
        spare_nodes=recipe.resources.spare_nodes,
        ranks_per_node=recipe.ranks_per_node,
        launcher=recipe.launcher,
        overrides=loaded.overrides,
        runs_dir=runs_dir,
        login=profile.login if scheduler == "ssh" else None,
        uploads=uploads,
        script_name=job.script_name,
        tasks=tuple(array_indices(recipe.array.spec)) if recipe.job_kind == "array" else (),
        array_throttle=int(recipe.array.spec.partition("%")[2]) if recipe.array and "%" in recipe.array.spec else None,
        links=len(array_indices(recipe.array.spec)) if recipe.job_kind == "chain" else 0,
        cluster=profile.name,
        tracking=tracked_run(recipe.tracking),
        secrets=tuple(recipe.secrets),
        snapshot=snapshot,
    )


def tracked_run(tracking: Tracking) -> TrackedRun | None:
    if tracking.tracker == "none" or tracking.run_id is None:
        return None
    return TrackedRun(
        tracker=tracking.tracker, run_id=tracking.run_id, dir=tracking.dir or "", offline=tracking.offline
    )


def schedule(request: SubmitRequest, accept_new_host_key: bool = False) -> RunRecord:
    with open_scheduler(request.scheduler, request.login, accept_new_host_key) as scheduler:
        return scheduler.submit(request)


def statuses(
    records: list[RunRecord], accept_new_host_key: bool = False, unreachable_ok: bool = False
) -> list[JobStatus]:
    """Each record's status, asking each adapter (and each login node) once. With
    ``unreachable_ok`` (listings), runs on a login node that cannot be reached are UNKNOWN, with
    the reason, instead of failing the whole listing."""
    from clusterkit.errors import SSHError
    from clusterkit.runs.status import UNKNOWN

    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.scheduler, repr(sorted((record.login or {}).items()))), []).append(record)
    found: dict[int, JobStatus] = {}
    for group in groups.values():
        try:
            with open_scheduler(group[0].scheduler, login_of(group[0]), accept_new_host_key) as scheduler:
                found.update(zip(map(id, group), scheduler.statuses(group)))
        except SSHError as exc:
            if not unreachable_ok:
                raise
            found.update({id(record): JobStatus(UNKNOWN, reason=str(exc)) for record in group})
    return [found[id(record)] for record in records]


def status_of(record: RunRecord) -> JobStatus:
    return statuses([record])[0]


@contextmanager
def creating_run_dir(path: object) -> Iterator[None]:
    """File-system errors while creating a run directory as one line naming it, never a traceback:
    the user's path (a file in the way, no permission) exit 2, the machine's (a full disk) exit 1."""
    try:
        yield
    except OSError as exc:
        error = PathError if is_users_path_error(exc) else FileSystemError
        raise error(f"cannot create run directory {path}: {exc.strerror or exc}") from None

"""Submission as ``schedule(dry_run(...))`` (torchx's shape): :func:`dry_run` builds the exact,
immutable request; a scheduler adapter only sends it. ``clusterkit submit --dry-run`` prints the
request's script, which is byte-identical to what reaches ``sbatch``."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath
from typing import Iterator

from clusterkit.errors import FileSystemError, PathError, UserError, is_users_path_error
from clusterkit.load.loader import LoadedRecipe
from clusterkit.spec.profile import ClusterProfile, Login
from clusterkit.render.job import RenderedJob
from clusterkit.runs.layout import JOB_SCRIPT, UPLOAD_PREFIX, submission_file
from clusterkit.runs.record import RunRecord

SCHEDULERS = ("slurm", "local", "ssh")
LOCAL_MAX_NODES = 254  # the local executor's nodes are the loopback addresses 127.0.0.1-254


@dataclass(frozen=True)
class SubmitRequest:
    scheduler: str
    name: str
    recipe: str
    # <runs_dir>/<name>: the run directory is <job id> below it (known only once submitted). For
    # ssh, relative to the login node's remote_workdir, where sbatch runs.
    runs_root: PurePath
    script: str
    files: dict[str, str]
    nodes: int
    ranks_per_node: int
    launcher: str
    overrides: tuple[str, ...] = ()
    runs_dir: str = "./runs"  # as the recipe says it (the login node resolves it for ssh)
    login: Login | None = None
    # Local task scripts the login node needs, relative paths kept (the job runs in remote_workdir).
    uploads: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        """The command that will run the script (the script's own path is chosen at submit time)."""
        if self.scheduler == "ssh":
            assert self.login is not None
            bundle = f"{self.runs_root}/{UPLOAD_PREFIX}<id>"
            return ["ssh", self.login.host, f"cd {self.login.remote_workdir} && {self.login.python} -m clusterkit "
                    f"submit --bundle {bundle}  (or, without clusterkit there: sbatch --hold {bundle}/{JOB_SCRIPT})"]
        if self.scheduler == "slurm":
            # Held until clusterkit has written the run directory: SLURM does not create log folders.
            return ["sbatch", "--hold", f"{self.runs_root}/<job id>/{submission_file('<job id>')}"]
        return ["bash", f"{self.runs_root}/<job id>/{JOB_SCRIPT}"]


def default_scheduler(profile: ClusterProfile) -> str:
    """SLURM where ``sbatch`` is on PATH (a login node); else over SSH when the profile names a
    login node (a laptop); else the local executor."""
    if shutil.which("sbatch"):
        return "slurm"
    return "ssh" if profile.login else "local"


class SchedulerUnavailable(UserError, LookupError):
    """The chosen executor cannot reach this cluster (reported like an unknown name: exit 2)."""


def dry_run(loaded: LoadedRecipe, job: RenderedJob, scheduler: str | None = None) -> SubmitRequest:
    recipe, profile = loaded.recipe, loaded.profile
    scheduler = scheduler or default_scheduler(profile)
    runs_dir = recipe.runs_dir or "./runs"
    uploads: tuple[str, ...] = ()
    if scheduler == "ssh":
        if profile.login is None:
            raise SchedulerUnavailable(f"{loaded.profile_path}: cluster profile {profile.name!r} names no login "
                                       f"node (login: {{host: ...}}), so it cannot be reached over SSH")
        runs_root: PurePath = PurePosixPath(runs_dir) / recipe.name
        script = recipe.task.script
        if script and not recipe.task.module and not PurePath(script).is_absolute() and Path(script).is_file():
            uploads = (script,)
    else:
        runs_root = Path(runs_dir).expanduser().absolute() / recipe.name
    if scheduler == "local" and recipe.resources.nodes > LOCAL_MAX_NODES:
        raise SchedulerUnavailable(f"{loaded.path}: resources.nodes: the local executor runs at most "
                                   f"{LOCAL_MAX_NODES} nodes (127.0.0.1-{LOCAL_MAX_NODES}), not {recipe.resources.nodes}")
    return SubmitRequest(
        scheduler=scheduler,
        name=recipe.name,
        recipe=str(loaded.path.absolute()),
        runs_root=runs_root,
        script=job.script,
        files=dict(job.files),
        nodes=recipe.resources.nodes,
        ranks_per_node=recipe.ranks_per_node,
        launcher=recipe.launcher,
        overrides=loaded.overrides,
        runs_dir=runs_dir,
        login=profile.login if scheduler == "ssh" else None,
        uploads=uploads,
    )


def schedule(request: SubmitRequest) -> RunRecord:
    if request.scheduler == "slurm":
        from clusterkit.schedulers.slurm import submit
    elif request.scheduler == "ssh":
        from clusterkit.schedulers.ssh import submit
    else:
        from clusterkit.schedulers.local import submit
    return submit(request)


@contextmanager
def creating_run_dir(path: PurePath) -> Iterator[None]:
    """File-system errors while creating a run directory as one line naming it, never a traceback:
    the user's path (a file in the way, no permission) exit 2, the machine's (a full disk) exit 1."""
    try:
        yield
    except OSError as exc:
        error = PathError if is_users_path_error(exc) else FileSystemError
        raise error(f"cannot create run directory {path}: {exc.strerror or exc}") from None


def write_run_files(request: SubmitRequest, run_dir: Path) -> None:
    for file_name, text in request.files.items():
        (run_dir / file_name).write_text(text, encoding="utf-8")
    (run_dir / JOB_SCRIPT).chmod(0o755)

"""Submission as ``schedule(dry_run(...))`` (torchx's shape): :func:`dry_run` builds the exact,
immutable request; a scheduler adapter only sends it. ``clusterkit submit --dry-run`` prints the
request's script, which is byte-identical to what reaches ``sbatch``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from clusterkit.loader import LoadedRecipe
from clusterkit.render import RenderedJob
from clusterkit.runs import RunRecord

SCHEDULERS = ("slurm", "local")


@dataclass(frozen=True)
class SubmitRequest:
    scheduler: str
    name: str
    recipe: str
    # <runs_dir>/<name>: the run directory is <job id> below it (known only once submitted).
    runs_root: Path
    script: str
    files: dict[str, str]
    nodes: int
    ranks_per_node: int
    launcher: str
    overrides: tuple[str, ...] = ()

    @property
    def argv(self) -> list[str]:
        """The command that will run the script (the script's own path is chosen at submit time)."""
        if self.scheduler == "slurm":
            # Held until clusterkit has written the run directory: SLURM does not create log folders.
            return ["sbatch", "--hold", f"{self.runs_root}/<job id>/<job id>_submission.sh"]
        return ["bash", f"{self.runs_root}/<job id>/job.sbatch"]


def default_scheduler() -> str:
    """SLURM where ``sbatch`` is on PATH (a login node), else the local executor (a laptop)."""
    return "slurm" if shutil.which("sbatch") else "local"


def dry_run(loaded: LoadedRecipe, job: RenderedJob, scheduler: str | None = None) -> SubmitRequest:
    recipe = loaded.recipe
    return SubmitRequest(
        scheduler=scheduler or default_scheduler(),
        name=recipe.name,
        recipe=str(loaded.path.absolute()),
        runs_root=Path(recipe.runs_dir or "./runs").expanduser().absolute() / recipe.name,
        script=job.script,
        files=dict(job.files),
        nodes=recipe.resources.nodes,
        ranks_per_node=recipe.resources.gpus_per_node or 1,
        launcher=recipe.launcher,
        overrides=loaded.overrides,
    )


def schedule(request: SubmitRequest) -> RunRecord:
    if request.scheduler == "slurm":
        from clusterkit.slurm_scheduler import submit
    else:
        from clusterkit.local_scheduler import submit
    return submit(request)


def write_run_files(request: SubmitRequest, run_dir: Path) -> None:
    for file_name, text in request.files.items():
        (run_dir / file_name).write_text(text, encoding="utf-8")
    (run_dir / "job.sbatch").chmod(0o755)

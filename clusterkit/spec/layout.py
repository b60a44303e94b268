"""The run directory's layout: every file and folder name in ``<runs_dir>/<name>/<job id>/`` (and the
few clusterkit keeps beside it), owned here and nowhere else.

The CLI, the scheduler adapters, the in-job runner and, through the render context (``layout``),
the batch script all take the names from this module (those of the job's supervisor are defined
beside it, in clusterkit.supervisor.run_files, and imported here), so a name changes in one place and the
writer and its readers cannot drift apart. Each name says who writes it and who reads it. Names
are plain words (no quote, space or shell character: a test holds them to that) because the
templates put them inside double quotes as they are. Nothing here imports anything heavy.
"""

from __future__ import annotations

from typing import Literal

# The names the job's supervisor writes or reads are defined beside it (it imports nothing of clusterkit).
from clusterkit.supervisor.run_files import (  # noqa: F401
    CANCELLED_MARKER,
    EXIT_CODE,
    HANG_RECORD,
    HEARTBEAT,
    HOSTFILE,
    JOB_SCRIPT,
    LAUNCH_PLAN,
    METRICS,
    NCCL_TRACE_DIR,
    NCCL_TRACE_PREFIX,
    PREEMPTED_RECORD,
    PREFLIGHT_RESULT,
    RANKS_DIR,
    REQUEUED,
    RESTARTS,
    RETRIES,
    RETRY_LOCK,
    STACKS_DIR,
    STACKS_SUMMARY,
    STEP_TIMES_DIR,
    STEPS_DIR,
    STEPS_RECORD,
    SUPERVISOR_DIR,
    batch_log,
    node_dir,
    node_exit,
    node_log,
    step_dir,
    step_times,
)

Stream = Literal["out", "err"]  # the two log files of each node (srun --output / --error)
STREAMS: tuple[Stream, ...] = ("out", "err")

# --- Written by `clusterkit submit` before the job may start (it is held until they exist) ---
# (also JOB_SCRIPT, LAUNCH_PLAN and SUPERVISOR_DIR, above)
SWEEP_SCRIPT = "sweep.sbatch"  # render (a sweep), in the array's directory; run by sbatch: starts task i's point
SWEEP_POINTS = "sweep.json"  # render (a sweep), in the array's directory: each point's values; read by status
ENV_SCRIPT = "env.sh"  # render; read by people (job.sbatch holds the same lines)
JOB_JSON = "job.json"  # render: the resolved recipe and profile; read by the runner, preflight and bench
ACCELERATE_CONFIG = "accelerate_config.yaml"  # render; read by accelerate launch
DEEPSPEED_CONFIG = "ds_config.json"  # render; read by the runner (TrainingArguments.deepspeed)
RESOLVED_RECIPE = "recipe.resolved.yaml"  # render; read by people: the recipe as it was run
RUN_RECORD = "run.json"  # the scheduler adapters (runs.RunRecord); read by status, logs, cancel, ls, --resume
# The script's code as it was when submitted (snapshot:): its git tree or folder; the job runs the
# script from here. In an array's directory, shared by its tasks.
SNAPSHOT_DIR = "code"
SHIM_DIR = ".local-bin"  # the local executor: its srun/scontrol stand-ins, first on the job's PATH
# The adapters at submit (mode 0600; an array's in its top directory): the recipe's secrets, NAME=value\0
# each; read by the batch script, removed by the supervisor (schedulers.secret_values says when).
SECRETS_FILE = ".secrets.env"

# The job's supervisor writes HOSTFILE, EXIT_CODE and RETRIES, the node agents RANKS_DIR's node<N>.exit.

# --- Written by the ranks ---
# A saved model's weights (transformers' save_pretrained): in model/, and in an AutoTP checkpoint
# beside DeepSpeed's shards (the runner gathers them); read by export.
WEIGHTS = "model.safetensors"
MODEL_DIR = "model"  # the runner's final save_model; read by people (from_pretrained)
PROFILE_DIR = "profile"  # the runner (profile:): profile_trace, profile_table, nsys_report below it

# --- Checkpoints: the Trainer's output_dir ---
CHECKPOINTS_DIR = "checkpoints"  # the Trainer; read by resume, `submit --resume` and export
CHECKPOINT_PREFIX = "checkpoint-"  # the Trainer's checkpoint-<step> folders; read by checkpoint_files
COMPLETE = ".clusterkit-complete"  # the runner, rank 0, in a checkpoint all ranks finished; read by resume and export
LATEST = "latest"  # the runner, rank 0: the newest complete checkpoint's name; read by people and tools
# The Trainer, in each checkpoint; checked by checkpoint_files: without it a resume silently restarts at step 0.
TRAINER_STATE = "trainer_state.json"
# checkpoint_files renames a checkpoint to this prefix (atomic) before deleting it, so no reader ever
# takes a half-deleted folder for a complete checkpoint.
REMOVING_PREFIX = ".removing-"
DAMAGED_INFIX = ".damaged-"  # checkpoint_files sets a damaged checkpoint aside as <name>.damaged-<time>

# --- Written by other commands ---
EXPORT_DIR = "export"  # `clusterkit export`'s default output folder
# The marker in a folder that `render -o` or `export -o` wrote (runs.output_dir): what kind of output it
# holds and its files. Read by them (only such a folder is replaced) and by the code snapshot (never code).
OutputKind = Literal["render", "export"]
RENDER_MARKER = ".clusterkit-render"
EXPORT_MARKER = ".clusterkit-export"
OUTPUT_MARKERS: dict[OutputKind, str] = {"render": RENDER_MARKER, "export": EXPORT_MARKER}
CURVES_PNG = "curves.png"  # `clusterkit plot`'s default chart (a sweep: in the array's directory)

# --- Beside the run directories ---
# Every scheduler writes a run's files into <runs_dir>/<name>/.staging-<token>/ (the token is chosen by
# the dry run), submits the script there, and renames it to <job id>/ once the job has one.
STAGING_PREFIX = ".staging-"
# The local executor, in <runs_dir>: one empty file per job id ever given there, created exclusively,
# so ids stay unique across run names and across submits at the same moment.
LOCAL_JOB_IDS = ".local-job-ids"


# How SLURM's filename patterns name a job and its run directory below <runs_dir>/<name>/ (sbatch and
# srun both fill them in), by ResolvedRecipe.job_kind: a job is <job id>/; an array task is
# <array id>/<task id>/ and its job id, as clusterkit's records, scontrol and scancel write it,
# <array id>_<task id>; a chain's links all run in <array id>/, each with its own logs.
JOB_ID_PATTERN = {"job": "%j", "array": "%A_%a", "chain": "%A_%a"}
RUN_DIR_PATTERN = {"job": "%j", "array": "%A/%a", "chain": "%A"}
# The same in the batch shell.
_TASK_ID = "${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID"
RUN_DIR_SHELL = {
    "job": "${CLUSTERKIT_RETRY_OF:-$SLURM_JOB_ID}",
    "array": "$SLURM_ARRAY_JOB_ID/$SLURM_ARRAY_TASK_ID",
    "chain": "$SLURM_ARRAY_JOB_ID",
}
JOB_ID_SHELL = {"job": "$SLURM_JOB_ID", "array": _TASK_ID, "chain": _TASK_ID}


def node_number(name: str) -> int:
    """N from a ``node<N>`` folder name (or a ``node<N>.exit`` stem); ValueError for anything else."""
    return int(name.removeprefix("node"))


def rank_record(rank: int | str) -> str:
    """``ranks/rank-<R>.json``: the runner, every rank, what it saw; read by the layout tests."""
    return f"{RANKS_DIR}/rank-{rank}.json"


def profile_trace(rank: int | str, first: int | str, last: int | str) -> str:
    """``profile/rank<R>-steps<A>-<B>.json``: the runner's torch.profiler Chrome trace of steps A..B
    on rank R (profile: kind torch); read by people (chrome://tracing, Perfetto)."""
    return f"{PROFILE_DIR}/rank{rank}-steps{first}-{last}.json"


def profile_table(rank: int | str, first: int | str, last: int | str) -> str:
    """``profile/rank<R>-steps<A>-<B>.txt``: beside the trace, its key-averages table; read by people."""
    return f"{PROFILE_DIR}/rank{rank}-steps{first}-{last}.txt"


def nsys_report(rank: str) -> str:
    """``profile/nsys-rank<R>``: nsys's -o for rank R (profile: kind nsys; nsys adds .nsys-rep)."""
    return f"{PROFILE_DIR}/nsys-rank{rank}"


def service_log(task: int | str, stream: Stream) -> str:
    """``service_<task>.out|err``: the service role's output, one file per service node (srun's %t)."""
    return f"service_{task}.{stream}"


def checkpoint_name(step: int) -> str:
    """``checkpoint-<step>``, as the Trainer names a save (its PREFIX_CHECKPOINT_DIR)."""
    return f"{CHECKPOINT_PREFIX}{step}"


# Launcher-owned names below ranks/node<N>/, read by logs and status.
# torchelastic's @record error files: <run id>/attempt_<k>/<local rank>/error.json.
TORCHRUN_ERROR_FILES = "*/attempt_*/*/error.json"
RANK_LOGS = "**/*.log"  # any rank's own log, torchrun's or DeepSpeed's


def mpirun_output(job_id: str) -> str:
    """``ranks/mpirun-<job id>``: Open MPI's --output-filename folder for one job (a requeued job writes
    a new one); mpirun writes each rank's output to ``<job family>/rank.<R>/{stdout,stderr}`` below."""
    return f"{RANKS_DIR}/mpirun-{job_id}"


def mpirun_rank_logs(rank: int | str) -> str:
    """Below ``mpirun_output``: one rank's stdout and stderr."""
    return f"*/rank.{rank}/std*"


def torchrun_rank_logs(local_rank: int | str) -> str:
    """torchrun --log-dir's stdout/stderr of one local rank: ``<run id>/attempt_<k>/<local rank>/std*.log``."""
    return f"*/attempt_*/{local_rank}/std*.log"


def deepspeed_rank_log(rank: int | str) -> str:
    """DeepSpeed --enable_each_rank_log's file of one global rank: ``<timestamp>_rank<R>.log``."""
    return f"*_rank{rank}.log"


# --- Experiment tracking (spec.tracking): the tracker's own files, in the first run of a resumed chain ---
TRACKING_DIR = "tracking"  # the job's env (WANDB_DIR, TENSORBOARD_LOGGING_DIR, ...); read by `clusterkit sync`
WANDB_OFFLINE_DIR = "wandb"  # below TRACKING_DIR: wandb's own offline-run-<time>-<id>/ folders, one per job start
MLFLOW_STORE = "mlruns"  # below TRACKING_DIR: the offline mlflow file store
TENSORBOARD_DIR = "tensorboard"  # below TRACKING_DIR: the event files, one per job start

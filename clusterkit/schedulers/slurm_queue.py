"""What SLURM says about many jobs, in one call for all of them: ``squeue`` for every job id asked
(each array task on a line of its own, ended jobs included for as long as the controller keeps them:
MinJobAge), and ``scontrol show job`` only when squeue itself fails. For the jobs that have ended,
one ``sacct`` call (:mod:`~clusterkit.schedulers.slurm_accounting`) adds when each was submitted,
started and ended and how long it ran, and for a job the controller no longer holds its final state
and exit code. A cluster without accounting answers that in one line; a job it has forgotten is then
told by its run directory's exit code.

The answer per job has scontrol's field names (JobState, Reason, ExitCode, SubmitTime, StartTime,
EndTime; sacct's ElapsedRaw; Accounting: why there is no accounting), so one function
(:func:`clusterkit.runs.status.slurm_status`) reads them all."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from clusterkit.runs.status import TERMINAL, normalize_slurm_state
from clusterkit.schedulers.host import Host, without_env
from clusterkit.schedulers.slurm_accounting import JobAccounting, NoAccounting, job_accounting

Fields = Mapping[str, str]

# squeue --Format fields, each printed whole (size 0) and ended by "|"; State and Reason are single
# words, so "|" cannot occur inside a value.
_SQUEUE_FIELDS = ("JobID", "ArrayJobID", "ArrayTaskID", "State", "Reason", "exit_code")
SQUEUE_FORMAT = ",".join(f"{name}:0|" for name in _SQUEUE_FIELDS)


# squeue takes filters and formats from the environment too: a user's SQUEUE_PARTITION=gpu or
# SQUEUE_FORMAT would hide jobs or change the lines; none of them applies here.
_SQUEUE_ENV = (
    "SQUEUE_ACCOUNT",
    "SQUEUE_FEDERATION",
    "SQUEUE_FORMAT",
    "SQUEUE_FORMAT2",
    "SQUEUE_LICENSES",
    "SQUEUE_LOCAL",
    "SQUEUE_NAMES",
    "SQUEUE_PARTITION",
    "SQUEUE_PRIORITY",
    "SQUEUE_QOS",
    "SQUEUE_SIBLING",
    "SQUEUE_USERS",
)
# Past this many ids, every job the controller holds is listed instead (one argument has a size limit).
MAX_JOB_IDS = 1000


def squeue_argv(job_ids: list[str], fields: str = SQUEUE_FORMAT) -> list[str]:
    """squeue for these jobs (``fields``: its --Format), untouched by the user's SQUEUE_* settings."""
    which = f"--jobs={','.join(job_ids)}" if len(job_ids) <= MAX_JOB_IDS else "--all"
    # --array: an array's pending tasks one per line, not folded into "123_[4-9]".
    return without_env(
        _SQUEUE_ENV,
        [
            "squeue",
            "--noheader",
            "--array",
            "--states=all",
            which,
            f"--Format={fields}",
        ],
    )


def _squeue_name(job_id: str, array_job_id: str, task_id: str) -> str:
    """The name clusterkit keeps for the job: ``<array id>_<index>`` for an array task, else its id."""
    return f"{array_job_id}_{task_id}" if task_id.isdigit() else job_id


def read_squeue(output: str) -> dict[str, dict[str, str]]:
    """``squeue --Format`` lines as :data:`SQUEUE_FORMAT` asks, e.g. ``5|1|2|FAILED|NonZeroExitCode|512|``."""
    jobs = {}
    for line in output.splitlines():
        values = [value.strip() for value in line.split("|")]
        if len(values) < len(_SQUEUE_FIELDS):
            continue  # not a job's line (a warning squeue printed)
        job_id, array_job_id, task_id, state, reason, status = values[: len(_SQUEUE_FIELDS)]
        # squeue's exit_code is the wait status (exit code << 8 | signal); scontrol writes "<code>:<signal>".
        exit_code = f"{int(status) >> 8}:{int(status) & 0x7F}" if status.isdigit() else status
        jobs[_squeue_name(job_id, array_job_id, task_id)] = {"JobState": state, "Reason": reason, "ExitCode": exit_code}
    return jobs


def oneliner_fields(line: str) -> dict[str, str]:
    """One line of ``scontrol --oneliner show job|node|partition``: its Key=value fields, which
    SLURM separates with spaces (a value may hold any other character)."""
    fields: dict[str, str] = {}
    for key, value in re.findall(r"(\w+)=([^ \t\n]*)", line):
        fields.setdefault(key, value)  # SLURM's own field comes first; a "Key=" inside a path later
    return fields


def read_scontrol(output: str) -> dict[str, dict[str, str]]:
    """``scontrol --oneliner show job``: a line per job (an array's pending tasks may share one,
    ``ArrayTaskId=4-9``: squeue lists those)."""
    jobs = {}
    for line in output.splitlines():
        fields = oneliner_fields(line)
        if "JobId" in fields:
            jobs[_squeue_name(fields["JobId"], fields.get("ArrayJobId", ""), fields.get("ArrayTaskId", ""))] = fields
    return jobs


def ask_slurm(host: Host, exit_codes: Mapping[str, int | None]) -> dict[str, dict[str, str]]:
    """What SLURM says of each job named in ``exit_codes`` (job id, or ``<array id>_<index>``, ->
    the exit code its run directory holds, if any): one squeue for all while the controller knows
    them, one sacct for those that have ended (:func:`with_accounting`). A job squeue leaves out is
    one the controller no longer holds (scontrol would not know it either); only when squeue itself
    fails, and a job has no exit code to tell how it ended, does one scontrol listing stand in."""
    if not exit_codes:
        return {}
    done = host.run(squeue_argv(sorted({job_id.partition("_")[0] for job_id in exit_codes})))
    if done.returncode == 0:
        said = read_squeue(done.stdout)
    elif all(exit_code is not None for exit_code in exit_codes.values()):
        return {}  # the controller does not answer and the run directories tell: nothing more to ask
    else:  # e.g. a lone job id SLURM has forgotten: "Invalid job id specified"
        listing = host.run(["scontrol", "--all", "--oneliner", "show", "job"])
        said = read_scontrol(listing.stdout) if listing.returncode == 0 else {}
    return with_accounting(host, {job_id: said[job_id] for job_id in exit_codes if job_id in said}, exit_codes)


def with_accounting(host: Host, said: Mapping[str, Fields], job_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    """The controller's answer completed from the accounting database, in one ``sacct`` call: for
    the jobs it no longer holds, how they ended, and once every job asked has ended (a look at
    finished work, not a poll of running work: a follow asks no sacct until its last look), when
    each was submitted, started and ended. A job both know keeps the controller's state and exit
    code; the newest instance of a requeued job is the one that counts. Without accounting, each
    forgotten job's answer is the one line saying so (``Accounting``)."""
    answers = {job_id: dict(fields) for job_id, fields in said.items()}
    going = any(normalize_slurm_state(fields.get("JobState", "")) not in TERMINAL for fields in said.values())
    asking = [job_id for job_id in job_ids if job_id not in said or not going]
    if not asking:
        return answers
    # An array task is found under its array's id (sacct lists every task of it).
    found = job_accounting(host, sorted({job_id.partition("_")[0] for job_id in asking}))
    if isinstance(found, NoAccounting):
        answers.update({job_id: {"Accounting": found.line} for job_id in asking if job_id not in said})
        return answers
    newest = {row.job_id: row for row in found}  # oldest first: the last instance of each job stays
    for job_id in asking:
        if job_id in newest:
            answers[job_id] = {**(said.get(job_id) or _final(newest[job_id])), **_times(newest[job_id])}
    return answers


def _final(row: JobAccounting) -> dict[str, str]:
    """How the job ended, in scontrol's words (a job killed by a signal has no exit code of its own)."""
    exit_code = {"ExitCode": f"{row.exit_code}:{row.signal}"} if row.exit_code is not None else {}
    return {"JobState": row.state, **exit_code}


def _times(row: JobAccounting) -> dict[str, str]:
    times = {"SubmitTime": row.submitted, "StartTime": row.started, "EndTime": row.ended}
    return {
        **{name: when.isoformat() for name, when in times.items() if when is not None},
        "ElapsedRaw": str(row.elapsed_s),
    }

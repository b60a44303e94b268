"""``submit --test-only``: SLURM's ``sbatch --test-only`` on exactly the job submit would send (the
same script and argv, less ``--parsable --hold``), for when and where it would start. Nothing is
queued and nothing is left behind: the script is written to a temporary folder on the host (no run
directory, no secrets file, no code snapshot) and that folder is removed.

A job SLURM refuses is one it can never run as asked: :class:`NeverRuns` (exit 2), one line with
SLURM's words and what to change in the recipe."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from clusterkit.errors import SchedulerError, UserError, printable
from clusterkit.schedulers.api import SubmitRequest
from clusterkit.schedulers.host import Host, checked

TEST_ONLY_TIMEOUT_S = 120.0

# sbatch's refusal (its stderr: "allocation failure: <why>" for --test-only, "sbatch: error: ..."
# before it asks the controller) -> what to change; the first match wins.
_REFUSALS = (
    (
        "Requested node configuration is not available",
        "the partition has too few nodes with what one node of this job asks (GPUs, CPUs, memory, "
        "features): lower resources.nodes, gpus_per_node, cpus_per_task or mem, or pick another "
        "resources.partition (clusterkit gpus lists them)",
    ),
    ("Node count specification invalid", "the partition has fewer nodes than asked: lower resources.nodes"),
    ("Requested time limit is invalid", "resources.time is over the partition's limit: lower it"),
    ("Invalid partition name", "resources.partition names no partition you may use (clusterkit gpus lists them)"),
    ("Invalid account", "resources.account is not one you may use with this partition"),
    ("Invalid qos", "resources.qos is not one you may use"),
    ("Invalid generic resource", "the cluster has no such GRES: check the profile's gpu_request and gpus_per_node"),
    ("Invalid feature specification", "no node has the features of resources.constraint"),
    ("Job violates accounting/QOS policy", "the job is over a limit of your account or QOS: ask for less"),
)


class NeverRuns(UserError):
    """SLURM would refuse the job as it is (exit 2): what to change, in one line."""


@dataclass(frozen=True)
class Estimate:
    """sbatch --test-only's answer: "Job 12 to start at 2026-11-27T05:00:00 using 4 processors on
    nodes node[1-2] in partition debug"."""

    start: str
    processors: int
    nodes: str
    partition: str

    def to_json(self) -> dict:
        return {"start": self.start, "processors": self.processors, "nodes": self.nodes, "partition": self.partition}


_ESTIMATE = re.compile(
    r"Job \S+ to start at (?P<start>\S+) using (?P<processors>[0-9]+) processors on nodes? "
    r"(?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def trial_argv(request: SubmitRequest, script: str) -> list[str]:
    """The request's argv as a test: ``--test-only`` instead of ``--parsable --hold``, ``script``
    (the temporary copy) instead of the staging one."""
    argv = list(request.argv)
    at = argv.index("sbatch")
    options = [word for word in argv[at + 1 : -1] if word not in ("--parsable", "--hold")]
    return [*argv[:at], "sbatch", "--test-only", *options, script]


def read_estimate(output: str) -> Estimate | None:
    match = _ESTIMATE.search(output)
    if match is None:
        return None
    return Estimate(match["start"], int(match["processors"]), match["nodes"], match["partition"])


def refusal(said: str) -> str:
    """sbatch's error as one line, with what to change where it is one clusterkit knows."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    words = "; ".join(re.sub(r"^(sbatch: error: |allocation failure: )", "", line) for line in lines)
    words = words or "no reason given"
    advice = next((what for error, what in _REFUSALS if error.lower() in said.lower()), None)
    return printable(f"SLURM would never run this job: {words}" + (f": {advice}" if advice else ""))


def estimate_start(host: Host, request: SubmitRequest) -> Estimate:
    """When and where SLURM would start the request's job now (nothing queued, nothing kept)."""
    folder = checked(host, ["mktemp", "-d"]).strip()
    if not folder.startswith("/") or "\n" in folder:
        raise SchedulerError(f"mktemp -d on {host.name} answered {folder!r}, not a folder")
    try:
        script = f"{folder}/{PurePosixPath(request.script_name).name}"
        host.write_file(script, request.script, 0o700)
        done = host.run(trial_argv(request, script), timeout=TEST_ONLY_TIMEOUT_S)
    finally:
        host.remove_tree(folder)
    said = f"{done.stderr}\n{done.stdout}"
    if done.returncode != 0:
        # SLURM refusing the job is the job's fault (exit 2); not reaching SLURM is not (exit 1).
        if "allocation failure" in said.lower() or any(error.lower() in said.lower() for error, _ in _REFUSALS):
            raise NeverRuns(refusal(said))
        detail = [line.strip() for line in said.splitlines() if line.strip()]
        raise SchedulerError(f"sbatch --test-only failed ({done.returncode}): {detail[-1] if detail else 'no output'}")
    estimate = read_estimate(said)
    if estimate is None:
        raise SchedulerError(f"sbatch --test-only answered {said.strip()!r}, not a start estimate")
    return estimate

"""launcher: ray: a Ray cluster on the allocation, the driver on it, and its end.

In the batch shell (:func:`start`, :meth:`Cluster.stop`): the head's srun step on the first training
node; once its GCS port answers, one step over the other nodes with a worker on each; then a check,
in the job's Python, that Ray reports every node alive (the plan's ``check``, which imports ray). The launch (the driver, the recipe's script)
then runs once in the batch shell with ``RAY_ADDRESS``; when it ends, or the job stops, the stop
file (``ray/stop``) tells every node to stop its Ray (SIGTERM to its ``ray start --block``, which
stops the node's Ray processes), and each step is waited for. Not srun's SIGTERM: SLURM would
cancel the step and kill what is left after its KillWait, before the logs are kept.

On each node (:func:`run_node`, ``supervisor ray-node head|worker OPTIONS...``): ``ray start --block``
with the node's address (resolved from its SLURM name: several nodes may share one machine), the
CPUs and GPUs the allocation gives, and its temp dir (sockets, logs) in ``<run dir>/ray/<host>``.
Ray's unix sockets lie below it and may be at most 107 bytes long: where that folder's path is too
long, Ray runs in a private folder in the node's temp directory and its logs are copied into the run
directory when it stops (the log says where it ran).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from .environment import JobEnvironment
from .plan import LaunchPlan
from .processes import exit_status
from .run_files import RAY_DIR
from .steps import Running, free_port, wait_until_ready
from .steps import start as start_step

# Ray's sockets lie at <temp dir>/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store
# (at most 64 bytes after the temp dir), and a unix socket's path holds at most 107 bytes.
SOCKET_PATH_MAX = 107
SOCKET_TAIL = 70
# The head's (GCS) port, from the job id: above Ray's default worker ports (10002-19999), below
# Linux's ephemeral ones.
PORTS_FROM, PORTS = 20000, 10000
STOP = "stop"  # below RAY_DIR: written when the driver ended; each node then stops its Ray
STOP_TIMEOUT_S = 60.0
WATCH_EVERY_S = 0.5  # how often a node looks for the stop file


class Cluster:
    """The started Ray steps (the head's first) and the address the driver is given."""

    def __init__(self, address: str, run_dir: str) -> None:
        self.address = address
        self.stop_file = Path(run_dir) / RAY_DIR / STOP
        self.steps: List[Running] = []
        self.ready = False

    def stop(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Every node's Ray stopped and each step waited for: asked through the stop file, so that
        each node stops its own Ray and keeps its logs; a step still running after
        ``STOP_TIMEOUT_S`` is ended by SLURM (SIGTERM to srun, then its KillWait)."""
        self.stop_file.touch()
        started = clock()
        for running in reversed(self.steps):  # the workers first
            if running.poll(max(0.0, STOP_TIMEOUT_S - (clock() - started))) is None:
                running.stop()
        print("clusterkit: Ray stopped on every node", flush=True)


def start(plan: LaunchPlan, job: JobEnvironment, hosts: Sequence[str], run_dir: str, environ: dict) -> Cluster:
    """Start the cluster; ``Cluster.ready`` says whether every node joined (else the log says why).
    ``environ`` gets ``RAY_ADDRESS`` (the driver's) and ``CLUSTERKIT_RAY_ADDRESS`` (the nodes')."""
    ray = plan.ray
    assert ray is not None
    try:
        head_ip = socket.gethostbyname(hosts[0])
    except OSError as exc:
        print(f"clusterkit: cannot resolve Ray's head node {hosts[0]}: {exc}: not running the driver", flush=True)
        return Cluster("", run_dir)
    port = free_port(job.slurm_job_id, head_ip, first=PORTS_FROM, count=PORTS)
    cluster = Cluster(f"{head_ip}:{port}", run_dir)
    environ.update(RAY_ADDRESS=cluster.address, CLUSTERKIT_RAY_ADDRESS=cluster.address)
    (Path(run_dir) / RAY_DIR).mkdir(exist_ok=True)  # srun opens each node's output there
    try:
        cluster.stop_file.unlink()  # an earlier attempt's (a requeued job's)
    except FileNotFoundError:
        pass
    print(f"clusterkit: starting Ray's head at {cluster.address} on {hosts[0]}", flush=True)
    try:
        cluster.steps.append(start_step(plan, ray.head, job, hosts, run_dir, environ))
        why = wait_until_ready(head_ip, port, ray.ready_timeout_s, cluster.steps[0])
        if why is not None:
            print(
                f"clusterkit: Ray's head did not answer ({why}; its output: {RAY_DIR}/head_0.err): "
                "not running the driver",
                flush=True,
            )
            return cluster
        if ray.workers is not None:
            cluster.steps.append(start_step(plan, ray.workers, job, hosts, run_dir, environ))
        waiting = job.spawn([*ray.check, cluster.address, str(plan.train_nodes), str(ray.ready_timeout_s)], environ)
    except OSError as exc:  # srun, or the job's Python
        print(f"clusterkit: cannot start {exc.filename or 'srun'!r}: {exc.strerror or exc}", flush=True)
        return cluster
    code = exit_status(waiting.wait())
    cluster.ready = code == 0 and all(running.process.poll() is None for running in cluster.steps)
    if not cluster.ready:
        print(
            f"clusterkit: the Ray cluster did not come up ({code}; each node's output: {RAY_DIR}/): "
            "not running the driver",
            flush=True,
        )
    return cluster


def temp_dir(wanted: Path) -> tuple[Path, bool]:
    """Ray's temp dir: ``wanted`` where its sockets' paths fit, else a new private folder in the
    node's temp directory (True: the logs are to be copied to ``wanted`` at the end)."""
    if len(os.fsencode(str(wanted))) + SOCKET_TAIL <= SOCKET_PATH_MAX:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted, False
    base = tempfile.gettempdir()  # a site's TMPDIR may be too deep as well
    if len(os.fsencode(base)) + len("/ck-ray-12345678") + SOCKET_TAIL > SOCKET_PATH_MAX:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="ck-ray-", dir=base)), True


def run_node(role: str, options: List[str]) -> int:
    """This node's ``ray start --block`` (``role``: head or worker), until it is ended: its exit
    code is 0 when clusterkit ended it (the job's normal end), else Ray's own."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    address = os.environ["CLUSTERKIT_RAY_ADDRESS"]
    try:  # several nodes may share a machine: each its own address
        ip = socket.gethostbyname(host)
    except OSError as exc:
        print(f"clusterkit: cannot resolve this node's name {host}: {exc}", file=sys.stderr, flush=True)
        return 1
    logs = Path(os.environ["RUN_DIR"]) / RAY_DIR / host
    temp, elsewhere = temp_dir(logs)
    if elsewhere:
        print(f"clusterkit: the run directory's path is too long for Ray's sockets: Ray runs in {temp}", flush=True)
    where = [f"--port={address.rsplit(':', 1)[1]}", "--head"] if role == "head" else [f"--address={address}"]
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats", *where]
    argv += [f"--node-ip-address={ip}", f"--temp-dir={temp}", *options]
    stopped: List[int] = []
    started: List["subprocess.Popen[bytes]"] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        for child in started:  # ray start --block stops this node's Ray processes on SIGTERM
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    # Installed first: an end asked for while Ray starts still reaches it.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    started.append(subprocess.Popen(argv))
    if stopped:
        started[0].send_signal(signal.SIGTERM)
    stop_file = logs.parent / STOP
    while True:
        try:
            code = exit_status(started[0].wait(timeout=WATCH_EVERY_S))
            break
        except subprocess.TimeoutExpired:
            if not stopped and stop_file.exists():  # the driver ended: this node's Ray stops
                stop(signal.SIGTERM, None)
    if elsewhere:
        _keep_logs(temp, logs)
    return 0 if stopped else code


def _keep_logs(temp: Path, logs: Path) -> None:
    """The logs of Ray's session copied into the run directory, its private folder removed."""
    session = temp / "session_latest" / "logs"
    try:
        if session.is_dir():
            shutil.copytree(session, logs / "logs", symlinks=True, dirs_exist_ok=True)
    except (OSError, shutil.Error) as exc:
        print(f"clusterkit: cannot copy Ray's logs from {session} to {logs}: {exc}", file=sys.stderr, flush=True)
    shutil.rmtree(temp, ignore_errors=True)


def main(argv: List[str]) -> Optional[int]:
    """``ray-node ROLE OPTIONS...``; None: not that."""
    if argv[:1] == ["ray-node"] and argv[1:2] in (["head"], ["worker"]):
        return run_node(argv[1], argv[2:])
    return None

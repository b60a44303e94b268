"""The submit/run side under attack: concurrent submits, failing and killed nodes, cancel, Ctrl-C,
full disks and bad paths, damaged run records and bundles, out-of-range arguments, and the dev
cluster's default-config link. The local executor's jobs are real (bash, the srun stand-in,
torchrun, one tiny script per rank); each takes a few seconds."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from clusterkit.cli import main as cli
from clusterkit.load.loader import load_recipe
from clusterkit.render.job import render_job
from clusterkit.runs.preflight_report import format_report
from clusterkit.runs.record import RunRecord, find_run, read_record
from clusterkit.runs.status import COMPLETED
from clusterkit.runtime.preflight import bus_bandwidth
from clusterkit.schedulers import local as local_scheduler
from clusterkit.schedulers.api import dry_run, schedule
from clusterkit.schedulers.api import status_of as job_status
from clusterkit.schedulers.host import LocalHost
from clusterkit.schedulers.local_slurm import job_markers, processes_with
from conftest import REPO, run_cli

HOLD = REPO / "tests" / "scripts" / "hold_node.py"
REPORT_PORT = REPO / "tests" / "scripts" / "report_port.py"


def _recipe(tmp_path: Path, name: str, script: Path, *args: str, nodes: int = 1) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "resources": {"nodes": nodes, "gpus_per_node": 1, "time": "5"},
                "task": {"script": str(script), "args": list(args)},
                "runs_dir": str(tmp_path / "runs"),
            }
        )
    )
    return path


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.2)


def _submit_local(recipe: Path) -> RunRecord:
    done = run_cli("submit", str(recipe), "--executor", "local", cwd=recipe.parent)
    assert done.returncode == 0, done.stderr
    return read_record(Path(done.stdout.split("run dir: ", 1)[1].split()[0]))


def _started_holding(tmp_path: Path, *args: str, nodes: int = 2) -> RunRecord:
    """A local job whose every node's rank is up and holding (sleeping)."""
    record = _submit_local(_recipe(tmp_path, "hold", HOLD, *args, nodes=nodes))
    _wait(lambda: all((record.path / f"started-{node}").exists() for node in range(nodes)), "ranks started")
    return record


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


# --- 1. ids and rendezvous ports under concurrency ---------------------------------------------


def test_job_ids_stay_unique_when_allocated_from_the_same_moment(tmp_path: Path) -> None:
    ids: list[str] = []
    threads = [
        threading.Thread(target=lambda: ids.append(local_scheduler.allocate_job_id(tmp_path / "ids", 500)))
        for _ in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(ids, key=int) == [str(500 + i) for i in range(16)]


def test_same_millisecond_submits_get_their_own_id_and_port_and_both_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen_ms = 123_456_789  # every submit reads the same clock: the ids must still differ
    monkeypatch.setattr(time, "time_ns", lambda: frozen_ms * 1_000_000)
    requests = []
    for name in ("first", "second"):
        loaded = load_recipe(_recipe(tmp_path, name, REPORT_PORT))
        requests.append(dry_run(loaded, render_job(loaded), "local"))
    # Something already listens on the first id's derived port: that job must move on, not fail.
    derived = 10000 + frozen_ms % 20000
    listener = socket.create_server(("", derived))
    try:
        records: list[RunRecord] = []
        threads = [threading.Thread(target=lambda r=request: records.append(schedule(r))) for request in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        monkeypatch.undo()
        assert sorted(r.job_id for r in records) == [str(frozen_ms), str(frozen_ms + 1)]
        _wait(lambda: all(job_status(r).done for r in records), "both jobs ended", 120)
    finally:
        listener.close()
    assert [job_status(r).state for r in records] == [COMPLETED, COMPLETED]
    ports = {r.job_id: json.loads((r.path / "port.json").read_text())["port"] for r in records}
    assert ports == {str(frozen_ms): 10000 + (derived - 10000 + 997) % 20000, str(frozen_ms + 1): derived + 1}
    for record in records:  # `status ID` finds exactly that run
        shown = run_cli("status", record.job_id, "--runs-dir", str(tmp_path / "runs"))
        assert shown.stdout.splitlines()[0] == f"{record.job_id}  {record.name}  COMPLETED  exit 0"


# --- 2. the local executor's processes ---------------------------------------------------------


def test_a_failing_node_1_ends_the_whole_job_promptly(tmp_path: Path) -> None:
    started = time.monotonic()
    record = _submit_local(_recipe(tmp_path, "hold", HOLD, "--fail-node", "1", nodes=2))
    _wait(lambda: job_status(record).done, "the job ended after node 1 failed (node 0 holds for 600 s)", 90)
    assert time.monotonic() - started < 90
    status = job_status(record)
    assert (status.state, status.exit_code) == ("FAILED", 1)
    assert status.failure is not None and status.failure.startswith("rank 1 (node 1, 127.0.0.2): exit code 3")
    assert processes_with(job_markers(record.run_dir)) == [], "node 0's rank outlived the job"


def test_a_local_job_is_running_until_its_post_run_hooks_end_not_when_its_exit_code_is_written(
    tmp_path: Path,
) -> None:
    recipe = _recipe(tmp_path, "hooked", REPORT_PORT)
    document = yaml.safe_load(recipe.read_text())
    release = tmp_path / "release"
    document["hooks"] = {"post_run": [f"while [ ! -e {shlex.quote(str(release))} ]; do sleep 0.1; done"]}
    recipe.write_text(yaml.safe_dump(document))
    record = _submit_local(recipe)
    _wait(lambda: (record.path / "exit_code").exists(), "the supervisor wrote the exit code")
    time.sleep(0.5)
    assert job_status(record).state == "RUNNING"  # its batch process is still running the hook
    release.touch()
    _wait(lambda: job_status(record).done, "the job ended once its hook did")
    assert (job_status(record).state, processes_with(job_markers(record.run_dir))) == (COMPLETED, [])


def test_a_record_read_while_it_is_written_is_whole_or_absent(tmp_path: Path) -> None:
    """The run dir's records (exit_code, hostfile, hang.json, ...) are polled by status and by people
    while the supervisor writes them: a reader sees no file or the whole text, never an empty one
    (CI once read exit_code between its truncation and its write)."""
    from clusterkit.supervisor.run_files import write_whole

    path, text, seen = tmp_path / "exit_code", "0\n", set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen.add(path.read_text())
            except FileNotFoundError:
                seen.add(None)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(3000):
            write_whole(path, text)
    finally:
        done.set()
        reader.join()
    assert seen <= {None, text} and text in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit_code"], "no temporary file is left behind"


def test_cancel_stops_every_process_then_leaves_the_ended_run_alone(tmp_path: Path) -> None:
    record = _started_holding(tmp_path)
    assert len(processes_with(job_markers(record.run_dir))) >= 6  # shell, srun, 2 x (node shell, torchrun, rank)
    cancel = run_cli("cancel", record.job_id, "--runs-dir", str(tmp_path / "runs"))
    assert cancel.stdout == f"cancelled job {record.job_id}\n"
    assert processes_with(job_markers(record.run_dir)) == []
    assert job_status(record).state == "CANCELLED"
    again = run_cli("cancel", record.job_id, "--runs-dir", str(tmp_path / "runs"))
    assert (again.returncode, again.stdout) == (
        0,
        f"job {record.job_id} already ended (CANCELLED): nothing cancelled\n",
    )


def test_cancel_kills_ranks_that_ignore_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    record = _started_holding(tmp_path, "--ignore-term", nodes=1)
    started = time.monotonic()
    local_scheduler.LocalScheduler().cancel(record, grace_s=1.0)
    assert time.monotonic() - started >= 1.0  # the rank ignored SIGTERM: SIGKILL came after the grace
    assert processes_with(job_markers(record.run_dir)) == []


def test_a_finished_run_is_not_cancelled(tmp_path: Path) -> None:
    record = _submit_local(_recipe(tmp_path, "port", REPORT_PORT))
    _wait(lambda: job_status(record).done, "the job ended")
    done = run_cli("cancel", str(record.path))
    assert done.stdout == f"job {record.job_id} already ended (COMPLETED): nothing cancelled\n"
    assert job_status(record).state == COMPLETED and not (record.path / "cancelled").exists()


def test_cancel_and_status_ignore_a_process_that_took_the_recorded_pid(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = tmp_path / "runs" / "old" / "7"
        run_dir.mkdir(parents=True)
        record = RunRecord("7", "old", "local", str(run_dir), "r.yaml", time.time(), 1, 1, "torchrun", pid=stranger.pid)
        record.write()
        assert job_status(record).state == "FAILED"  # its batch shell is gone; the pid is now someone else's
        local_scheduler.LocalScheduler().cancel(record, grace_s=0.5)
        assert stranger.poll() is None, "cancel killed a process that is not the job's"
    finally:
        stranger.kill()
        stranger.wait()


def test_killing_the_batch_shell_ends_the_ranks(tmp_path: Path) -> None:
    record = _started_holding(tmp_path)
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    _wait(
        lambda: processes_with(job_markers(record.run_dir)) == [], "every node process ended with the batch shell", 20
    )
    assert job_status(record).state == "FAILED"


def test_ctrl_c_during_submit_leaves_no_job_and_no_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = _recipe(tmp_path, "hold", HOLD)
    interrupted: list[RunRecord] = []

    def interrupt(self: RunRecord, directory: Path | None = None) -> None:
        interrupted.append(self)  # the batch process has started; its record is not written yet
        raise KeyboardInterrupt

    monkeypatch.setattr(RunRecord, "write", interrupt)
    assert cli.main(["submit", str(recipe), "--executor", "local"]) == 130
    assert interrupted and processes_with(job_markers(interrupted[0].run_dir)) == []
    assert list((tmp_path / "runs" / "hold").iterdir()) == []


def test_more_local_nodes_than_loopback_addresses_is_refused(tmp_path: Path) -> None:
    done = run_cli(
        "submit", str(_recipe(tmp_path, "wide", REPORT_PORT)), "--executor", "local", "--set", "resources.nodes=255"
    )
    assert done.returncode == 2
    assert _one_error_line(done).endswith(
        "resources.nodes: the local executor runs at most 254 nodes (127.0.0.1-254), not 255"
    )
    assert not (tmp_path / "runs").exists()


# --- 3. and 4. no partial run directories; file-system errors as one line ----------------------


def test_disk_full_while_writing_the_run_files_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def half_written(request, run_dir: Path) -> None:
        (run_dir / "job.sbatch").write_text("#!/bin/bash\nset -eu")  # cut short
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(local_scheduler, "write_run_files", half_written)
    assert cli.main(["submit", str(_recipe(tmp_path, "full", REPORT_PORT)), "--executor", "local"]) == 1
    root = tmp_path / "runs" / "full"
    assert capsys.readouterr().err == f"clusterkit: cannot create run directory {root}: No space left on device\n"
    assert list(root.iterdir()) == []


def test_a_refused_sbatch_leaves_no_run_dir_and_no_submission_file(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1\n"
    )
    (fake / "sbatch").chmod(0o755)
    done = run_cli(
        "submit",
        str(_recipe(tmp_path, "refused", REPORT_PORT)),
        "--executor",
        "slurm",
        env=dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}"),
    )
    assert done.returncode == 1
    assert _one_error_line(done) == (
        "clusterkit: sbatch refused the job: sbatch: error: Batch job submission failed: Invalid account"
    )
    assert list((tmp_path / "runs" / "refused").iterdir()) == []


@pytest.mark.slurm
def test_disk_full_after_sbatch_cancels_the_held_job(
    dev_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    queued: list[str] = []
    write_file = LocalHost.write_file

    def full_at_the_record(self: LocalHost, path: str, text: str, mode: int = 0o644) -> None:
        if path.endswith("/run.json"):  # written once sbatch has queued the job
            queued.append(Path(path).parent.name)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_file(self, path, text, mode)

    monkeypatch.setattr(LocalHost, "write_file", full_at_the_record)
    assert cli.main(["submit", str(_recipe(tmp_path, "full", REPORT_PORT)), "--executor", "slurm"]) == 1
    root = tmp_path / "runs" / "full"
    assert (
        capsys.readouterr().err
        == f"clusterkit: cannot create run directory {root / queued[0]}: No space left on device\n"
    )
    assert list(root.iterdir()) == []
    shown = subprocess.run(["scontrol", "show", "job", "-o", queued[0]], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in shown, "the held job was left in the queue"


def _immutable(directory: Path) -> Path:
    """A directory nobody, root included, may create anything in (or skip where chattr cannot)."""
    directory.mkdir()
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here: root cannot be denied a directory otherwise")
    return directory


@pytest.mark.parametrize("case", ["runs_dir is a file", "name too long", "no permission"])
def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path: Path, case: str) -> None:
    if case == "runs_dir is a file":
        runs_dir, reason = tmp_path / "runs", "Not a directory"
        runs_dir.write_text("not a directory")
    elif case == "name too long":
        runs_dir, reason = tmp_path / ("r" * 300), "File name too long"
    else:
        runs_dir, reason = _immutable(tmp_path / "locked") / "runs", "Operation not permitted"
    try:
        done = run_cli(
            "submit", str(_recipe(tmp_path, "fs", REPORT_PORT)), "--executor", "local", "--set", f"runs_dir={runs_dir}"
        )
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "locked")], capture_output=True)
    assert done.returncode == 2
    assert _one_error_line(done) == f"clusterkit: cannot create run directory {runs_dir / 'fs'}: {reason}"


# --- 5. damaged run records ---------------------------------------------------------------------

BROKEN_RECORDS = {
    "truncated": '{"job_id": "11", "name": "x", "sched',
    "a list": "[1, 2]",
    "missing keys": '{"job_id": "11"}',
    "wrong types": json.dumps(
        {
            "job_id": "11",
            "name": "x",
            "scheduler": "local",
            "run_dir": "/x",
            "recipe": "r",
            "submitted_at": 1.0,
            "nodes": "two",
            "ranks_per_node": 1,
            "launcher": "torchrun",
        }
    ),
    "a path as job id": json.dumps(
        {
            "job_id": "../11",
            "name": "x",
            "scheduler": "local",
            "run_dir": "/x",
            "recipe": "r",
            "submitted_at": 1.0,
            "nodes": 1,
            "ranks_per_node": 1,
            "launcher": "torchrun",
        }
    ),
    # An ssh run's login block, read back to reach the run again: checked as a profile's login: is.
    **{
        f"a login {what}": json.dumps(
            {
                "job_id": "11",
                "name": "x",
                "scheduler": "ssh",
                "run_dir": "runs/x/11",
                "recipe": "r",
                "submitted_at": 1.0,
                "nodes": 1,
                "ranks_per_node": 1,
                "launcher": "torchrun",
                "login": login,
            }
        )
        for what, login in (
            ("host that is an ssh option", {"host": "-oProxyCommand=touch /tmp/pwned"}),
            ("port out of range", {"host": "login", "port": 70000}),
            ("with an unknown key", {"host": "login", "shell": "sh"}),
            ("without a host", {"port": 22}),
            ("python of two words", {"host": "login", "python": "python3 -c x"}),
        )
    },
}


@pytest.mark.parametrize("damage", sorted(BROKEN_RECORDS))
def test_a_damaged_run_record_is_named_in_one_line(tmp_path: Path, damage: str) -> None:
    runs = tmp_path / "runs"
    bad = runs / "broken" / "11"
    bad.mkdir(parents=True)
    (bad / "run.json").write_text(BROKEN_RECORDS[damage])
    good = RunRecord("12", "good", "local", str(runs / "good" / "12"), "r.yaml", time.time(), 2, 2, "torchrun")
    good.path.mkdir(parents=True)
    good.write()
    (good.path / "exit_code").write_text("0\n")
    for command in (["status", "11"], ["logs", "11"], ["cancel", "11"], ["status", str(bad)]):
        done = run_cli(*command, "--runs-dir", str(runs))
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert _one_error_line(done).startswith(f"clusterkit: {bad / 'run.json'}: "), command
    for listing in (["ls"], ["status"]):  # the damaged run is skipped, the others listed
        done = run_cli(*listing, "--runs-dir", str(runs))
        assert done.returncode == 0 and re.search(r"^12 +good +COMPLETED", done.stdout, re.M), done.stdout
        assert _one_error_line(done).startswith(f"clusterkit: skipping {bad / 'run.json'}: "), listing


def test_a_run_is_found_by_job_id_among_many(tmp_path: Path) -> None:
    for job_id, name in (("5", "a"), ("6", "b")):
        run_dir = tmp_path / name / job_id
        run_dir.mkdir(parents=True)
        RunRecord(job_id, name, "local", str(run_dir), "r.yaml", 1.0, 1, 1, "torchrun").write()
    assert find_run("6", tmp_path).name == "b"
    with pytest.raises(LookupError, match="no run with job id \\*"):
        find_run("*", tmp_path)  # a pattern is not a job id


# --- 6. what sbatch answers -----------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["Submitted batch job 12", "", "12;cluster;extra\n13", "../12"])
def test_an_sbatch_answer_that_is_not_a_job_id_is_one_line_and_leaves_nothing(tmp_path: Path, answer: str) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(answer)}\n")
    (fake / "sbatch").chmod(0o755)
    done = run_cli(
        "submit",
        str(_recipe(tmp_path, "odd", REPORT_PORT)),
        "--executor",
        "slurm",
        env=dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}"),
    )
    assert done.returncode == 1
    assert _one_error_line(done).startswith("clusterkit: sbatch answered ")
    assert list((tmp_path / "runs" / "odd").iterdir()) == []


# --- 7. checked arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        ["bench", "R", "--nodes", "1", "--steps", "0"],
        ["bench", "R", "--nodes", "1", "--steps", "-5"],
        ["status", "--limit", "-3"],
        ["ls", "--limit", "0"],
    ],
)
def test_counts_must_be_positive(arguments: list[str]) -> None:
    done = run_cli(*arguments)
    assert done.returncode == 2 and "give a number from 1 to" in done.stderr.splitlines()[-1]


def test_bench_warmup_must_leave_steps_to_measure(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "bench", REPORT_PORT)
    done = run_cli("bench", str(recipe), "--nodes", "1", "--steps", "5", "--warmup", "5", "--executor", "local")
    assert done.returncode == 2
    assert _one_error_line(done) == "clusterkit bench: --warmup 5: give 0 to 4 (fewer than --steps 5)"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("rank", ["99", "4", "-1"])
def test_logs_of_a_rank_outside_the_run(tmp_path: Path, rank: str) -> None:
    run_dir = tmp_path / "r" / "8"
    run_dir.mkdir(parents=True)
    RunRecord("8", "r", "local", str(run_dir), "r.yaml", 1.0, 2, 2, "torchrun").write()
    done = run_cli("logs", "8", "--rank", rank, "--runs-dir", str(tmp_path))
    assert done.returncode == 2
    assert _one_error_line(done) == f"clusterkit: rank {rank} is not in this run (ranks 0-3)"


def test_one_rank_preflight_reports_no_bus_bandwidth() -> None:
    assert bus_bandwidth(3.0, 1) is None and bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    report = format_report(
        {
            "world_size": 1,
            "nodes": 1,
            "backend": "gloo",
            "slow_nodes": [],
            "slow_fraction": 0.5,
            "on_slow": "warn",
            "per_node": [{"node": 0, "host": "h", "busbw_gbps": None}],
            "sizes": [{"bytes": 1 << 20, "time_s": 0.001, "algbw_gbps": 1.0, "busbw_gbps": None}],
        }
    )
    assert report.splitlines()[2].split() == ["1", "MB", "1.00ms", "1.000", "GB/s", "n/a", "(1", "rank)"]


# --- 8. the dev cluster's default-config link ---------------------------------------------------------


def _checkout(root: Path, running: bool | None) -> Path:
    """A dev cluster directory with its slurm.conf and a slurmctld pid file naming a live process
    (this one: running True), an ended one (False), or none (None)."""
    root.mkdir(parents=True)
    (root / "slurm.conf").write_text("# Written by bin/dev-cluster; edits are overwritten on the next `up`.\n")
    if running is not None:
        pid = os.getpid() if running else subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout
        (root / "slurmctld.pid").write_text(f"{int(pid)}\n")
    return root / "slurm.conf"


def _sourced(function: str, checkout: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """One of bin/dev-cluster's functions, run for the cluster directory ``checkout``."""
    script = REPO / "bin" / "dev-cluster"
    given = dict(os.environ, CLUSTERKIT_DEV_CLUSTER_DIR=str(checkout), **env)
    return subprocess.run(
        ["bash", "-c", f'source "$1"; {function}', "bash", str(script)], env=given, capture_output=True, text=True
    )


def _dev_cluster(function: str, checkout: Path, etc: Path) -> None:
    done = _sourced(function, checkout, CLUSTERKIT_SLURM_ETC=str(etc))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "current, taken",
    [
        ("none", True),
        ("dangling", True),
        ("own", True),
        ("stopped cluster", True),
        ("cluster without pid", True),
        ("running cluster", False),
        ("site slurm.conf link", False),
        ("site slurm.conf file", False),
    ],
)
def test_up_takes_the_default_conf_link_unless_another_cluster_runs(tmp_path: Path, current: str, taken: bool) -> None:
    etc, mine = tmp_path / "etc-slurm", tmp_path / "mine"
    own_conf = _checkout(mine, running=True)
    etc.mkdir()
    link = etc / "slurm.conf"
    site = tmp_path / "site.conf"
    site.write_text("ClusterName=production\n")
    targets = {
        "dangling": tmp_path / "gone" / "slurm.conf",
        "own": own_conf,
        "site slurm.conf link": site,
        "stopped cluster": _checkout(tmp_path / "other", running=False) if current == "stopped cluster" else None,
        "cluster without pid": _checkout(tmp_path / "other", running=None)
        if current == "cluster without pid"
        else None,
        "running cluster": _checkout(tmp_path / "other", running=True) if current == "running cluster" else None,
    }
    if current == "site slurm.conf file":
        shutil.copy(site, link)
    elif current != "none":
        link.symlink_to(targets[current])
    before = os.readlink(link) if link.is_symlink() else None
    _dev_cluster("link_default_conf", mine, etc)
    if taken:
        assert os.readlink(link) == str(own_conf)
    elif current == "site slurm.conf file":
        assert not link.is_symlink() and link.read_text() == site.read_text()
    else:
        assert os.readlink(link) == before


@pytest.mark.parametrize("points_at_mine", [True, False])
def test_down_removes_the_default_conf_link_only_when_it_is_its_own(tmp_path: Path, points_at_mine: bool) -> None:
    etc = tmp_path / "etc-slurm"
    etc.mkdir()
    own_conf = _checkout(tmp_path / "mine", running=None)
    other_conf = _checkout(tmp_path / "other", running=True)
    (etc / "slurm.conf").symlink_to(own_conf if points_at_mine else other_conf)
    _dev_cluster("unlink_default_conf", tmp_path / "mine", etc)
    assert (etc / "slurm.conf").is_symlink() != points_at_mine


# --- 9. the dev cluster's accounting ------------------------------------------------------------------


@pytest.mark.parametrize("accounting", ["1", "0"])
def test_dev_cluster_accounting_lines_and_a_private_slurmdbd_conf(tmp_path: Path, accounting: str) -> None:
    checkout = tmp_path / "dev cluster ~%-"
    checkout.mkdir()
    done = _sourced(
        "gres=' Gres=gpu:2'; accounting_config; write_dbd_config",
        checkout,
        CLUSTERKIT_DEV_CLUSTER_ACCOUNTING=accounting,
    )
    assert done.returncode == 0, done.stderr
    if accounting == "0":
        assert done.stdout.split() == [
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
        ]
        assert not (checkout / "slurmdbd.conf").exists()
        return
    lines = done.stdout.split("\n")
    assert "AccountingStorageType=accounting_storage/slurmdbd" in lines and "AccountingStorageTRES=gres/gpu" in lines
    assert f"AccountingStoragePass={checkout}/munge.sock" in lines  # the dev cluster's munge, not the system's
    dbd = checkout / "slurmdbd.conf"
    password = (checkout / "mysql" / "slurm.pass").read_text()
    assert dbd.stat().st_mode & 0o777 == 0o600 and (checkout / "mysql").stat().st_mode & 0o777 == 0o700
    assert f"StoragePass={password}\n" in dbd.read_text() and len(password) >= 16
    assert password not in done.stdout  # slurm.conf, readable by every client, never holds it
    again = _sourced("write_dbd_config", checkout)  # the next `up` keeps the database's password
    assert again.returncode == 0 and (checkout / "mysql" / "slurm.pass").read_text() == password


def test_a_killed_daemon_not_yet_reaped_counts_as_stopped(tmp_path: Path) -> None:
    # A killed mariadbd stays a zombie until PID 1 reaps it; `up` must start a new one, not wait on it.
    zombie = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while not Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1].startswith("Z"):
        assert time.time() < deadline
        time.sleep(0.05)
    (tmp_path / "mariadbd.pid").write_text(f"{zombie.pid}\n")
    (tmp_path / "live.pid").write_text(f"{os.getpid()}\n")
    (tmp_path / "stale.pid").write_text("2147483646\n")
    said = [
        _sourced(f'alive "$CLUSTERKIT_DEV_CLUSTER_DIR/{name}"', tmp_path).returncode
        for name in ("mariadbd.pid", "live.pid", "stale.pid", "none.pid")
    ]
    zombie.wait()
    assert said == [1, 0, 1, 1]

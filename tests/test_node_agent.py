"""The node agent (``supervisor node PLAN STEP``), run as srun runs it: a real process around a real
program. What the program is given (rank variables, run-time values, the signal disposition it
starts with), who gets the preemption signal, and the record of how the node's program ended. And
the package itself: standard library only, readable by Python 3.8."""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clusterkit.supervisor
from clusterkit.supervisor.plan import LaunchPlan, Recovery, Step

SUPERVISOR = Path(clusterkit.supervisor.__file__).parent


def _plan(tmp_path: Path, argv: list[str], **fields) -> Path:
    step = Step(name="launch", hosts="train", nodes=1, tasks_per_node=1, argv=tuple(argv), **fields)
    plan = LaunchPlan(
        job_name="t",
        job_kind="job",
        train_nodes=1,
        slots_per_node=1,
        launch=step,
        recovery=Recovery(signal="USR2", max_requeues=0, max_retries=0),
    )
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "RUN_DIR": str(tmp_path),
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURMD_NODENAME": "node-b",
        "SLURM_JOB_ID": "77",
        "CLUSTERKIT_JOB_ID": "77",
        "MASTER_ADDR": "node-a",
        "MASTER_PORT": "12345",
        **extra,
    }


def _agent(plan: Path, env: dict[str, str], **popen) -> subprocess.Popen:
    # As the job runs it: the folder copied into the run directory, not the installed package.
    copy = plan.parent / "supervisor"
    if not copy.exists():
        shutil.copytree(SUPERVISOR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return subprocess.Popen([sys.executable, str(copy), "node", str(plan), "launch"], env=env, **popen)


PRINT_ENV = (
    "import os, sys, json; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1].split(',')}), sys.argv[2:])"
)


def test_a_task_per_rank_gets_its_ranks_and_its_run_time_values_and_nothing_else_is_expanded(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-c",
        PRINT_ENV,
        "RANK,LOCAL_RANK,NODE_RANK,WORLD_SIZE,LOCAL_WORLD_SIZE,TAG",
        "--out={run_dir}/r{rank}-{local_rank}-{node_rank}-{hostname}",
        "--at={master_addr}:{master_port}",
        "{rank} stays",
        "$(touch pwned)",
    ]
    plan = _plan(tmp_path, argv, expand=(4, 5), ranks="task", env={"TAG": "j{job_id}-r{rank}"}, env_expand=("TAG",))
    agent = _agent(plan, _env(tmp_path, TAG="j{job_id}-r{rank}"), stdout=subprocess.PIPE, text=True)
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0
    seen, args = out.split(" [", 1)
    assert json.loads(seen) == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "NODE_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "TAG": "j77-r3",
    }
    assert ast.literal_eval("[" + args) == [
        f"--out={tmp_path}/r3-1-1-node-b",
        "--at=node-a:12345",
        "{rank} stays",
        "$(touch pwned)",
    ]
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "ranks" / "node1.exit").read_text().split()[1] == "0"


def test_a_launcher_per_node_gets_only_its_node_rank(tmp_path: Path) -> None:
    plan = _plan(tmp_path, [sys.executable, "-c", PRINT_ENV, "RANK,NODE_RANK"], ranks="node")
    agent = _agent(plan, _env(tmp_path), stdout=subprocess.PIPE, text=True)
    out, _ = agent.communicate(timeout=60)
    assert '"RANK": null' in out and '"NODE_RANK": "1"' in out


HANDLER = """
import os, signal, subprocess, sys, time
run_dir = sys.argv[1]
status = open('/proc/self/status').read()
ignored = int(next(l for l in status.splitlines() if l.startswith('SigIgn:')).split()[1], 16) >> (signal.SIGUSR2 - 1) & 1
open(os.path.join(run_dir, 'started-ignored'), 'w').write(str(ignored))
# A child that keeps the default action: the signal would kill it, so it must not be sent there.
bystander = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_DFL); time.sleep(30)'])
open(os.path.join(run_dir, 'bystander'), 'w').write(str(bystander.pid))
def got(signum, frame):
    open(os.path.join(run_dir, 'got'), 'w').write('yes')
    bystander.terminate()
    sys.exit(0 if bystander.wait() == -15 else 5)
signal.signal(signal.SIGUSR2, got)
open(os.path.join(run_dir, 'ready'), 'w').write('')
time.sleep(30)
sys.exit(7)
"""


def _wait_for(path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("to_launcher, ignored", [(True, "0"), (False, "1")])
def test_the_preemption_signal_reaches_the_process_that_handles_it_and_spares_the_others(
    tmp_path: Path, to_launcher: bool, ignored: str
) -> None:
    """A rank started directly (launcher: python) starts with the signal at its default, so a
    framework that arms only where no handler exists (Lightning) arms; a launcher (torchrun) starts
    with it ignored, which its ranks inherit and replace with their handler. Either way the signal
    goes to the handler, never to a process that would die of it."""
    plan = _plan(tmp_path, [sys.executable, "-c", HANDLER, str(tmp_path)], signal_to_launcher=to_launcher)
    agent = _agent(plan, _env(tmp_path))
    _wait_for(tmp_path / "ready")
    agent.send_signal(signal.SIGUSR2)
    assert agent.wait(timeout=30) == 0
    assert (tmp_path / "got").read_text() == "yes" and (tmp_path / "started-ignored").read_text() == ignored


def test_a_rank_that_installs_its_handler_late_still_gets_the_signal(tmp_path: Path) -> None:
    """Preempted before the rank is ready (its imports take seconds; or the supervisor started the
    step after the signal came): the agent passes it on once the rank handles it."""
    late = HANDLER.replace("signal.signal(signal.SIGUSR2, got)", "time.sleep(1.5); signal.signal(signal.SIGUSR2, got)")
    plan = _plan(tmp_path, [sys.executable, "-c", late, str(tmp_path)], signal_to_launcher=True)
    agent = _agent(plan, _env(tmp_path, CLUSTERKIT_PREEMPTED="1"))
    assert agent.wait(timeout=30) == 0 and (tmp_path / "got").read_text() == "yes"


def test_sigterm_reaches_the_program_and_its_end_is_still_recorded(tmp_path: Path) -> None:
    program = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); open(sys.argv[1], 'w'); time.sleep(30)"
    plan = _plan(tmp_path, [sys.executable, "-c", program, str(tmp_path / "ready")])
    agent = _agent(plan, _env(tmp_path))
    _wait_for(tmp_path / "ready")
    agent.terminate()
    assert agent.wait(timeout=30) == 42
    assert (tmp_path / "ranks" / "node1.exit").read_text().split()[1] == "42"


def test_a_program_that_cannot_start_is_127_with_a_line_and_a_record(tmp_path: Path) -> None:
    plan = _plan(tmp_path, [str(tmp_path / "no such program")])
    agent = _agent(plan, _env(tmp_path), stderr=subprocess.PIPE, text=True)
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 127 and "clusterkit: cannot start" in err and "node-b" in err
    assert (tmp_path / "ranks" / "node1.exit").read_text().split()[1] == "127"


def test_a_rank_under_a_batch_shell_launcher_maps_its_mpi_ids_and_runs_its_module(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(
        "import os, sys; print(os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['NODE_RANK'], sys.argv[1:])\n"
    )
    shutil.copytree(SUPERVISOR, tmp_path / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        "PATH": os.environ["PATH"],
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "SLURM_PROCID": "1",
    }
    done = subprocess.run(
        [sys.executable, "-u", str(tmp_path / "supervisor" / "__main__.py"), "rank", "--module", "probe_mod", "a b"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "5 1 1 ['a b']\n", done.stderr


def test_the_supervisor_is_standard_library_python_3_8() -> None:
    """It runs on the nodes with their interpreter: nothing of clusterkit, nothing installed, and no
    syntax newer than 3.8 (the __main__ entry is readable by any Python 3, to say which it needs)."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted(SUPERVISOR.glob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 8) if path.name != "__main__.py" else (3, 4))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
                if node.module == "supervisor.cli" and path.name == "__main__.py":
                    names = []  # the copy in the run directory importing itself
            else:
                continue
            assert all(name.split(".")[0] in allowed for name in names), (path.name, names)


def _python(version: str) -> str | None:
    """An interpreter of that version that runs here: on PATH, or one pyenv keeps."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in [
        shutil.which(f"python{version}"),
        *map(str, sorted(root.glob(f"versions/{version}.*/bin/python{version}"))),
    ]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


PYTHON_3_8 = _python("3.8")


@pytest.mark.skipif(PYTHON_3_8 is None, reason="no python3.8 on this machine to run the supervisor with")
def test_the_copied_supervisor_runs_under_python_3_8(tmp_path: Path) -> None:
    plan = _plan(tmp_path, [PYTHON_3_8, "-c", "import sys; print(sys.version_info[:2])"])
    shutil.copytree(SUPERVISOR, tmp_path / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [PYTHON_3_8, str(tmp_path / "supervisor"), "node", str(plan), "launch"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == "(3, 8)\n", done.stderr


def test_an_older_python_is_told_which_it_needs(tmp_path: Path) -> None:
    old = _python("3.6") or _python("3.7")
    if old is None:
        pytest.skip("no python older than 3.8 here")
    done = subprocess.run([old, str(SUPERVISOR), "batch", "plan.json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "needs Python 3.8 or newer" in done.stderr and "Traceback" not in done.stderr

"""The node agent: each task of a step runs ``supervisor node PLAN STEP`` (srun starts it on every
node, or once per rank), which runs the step's program and stays its parent:

- the rank variables and run-time values this node or task knows are filled in (no shell: the
  program's words are passed to it exactly, only the marked ones expanded);
- the preemption signal is passed on to every process below that handles it (launchers such as
  torchrun do not pass it to their ranks); the launcher itself starts with it ignored where the step
  says so (one that would end on it), a rank started directly keeps the default (so a framework that
  arms its own handler only where none was set, as Lightning does, arms it);
- SIGTERM and SIGINT (the step being ended) are passed to the program, so that it can stop its own;
- when the program ends, when and how is recorded (``ranks/node<N>.exit``): the earliest failure
  names the failing node for status and the retry.

A step that says ``replace`` (task.program per rank) is the exception: once the variables and values
are filled in, the agent execs the program in its own place, and none of the above applies after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Set, Tuple

from . import pyspy
from .plan import UNSET_VARIABLE, LaunchPlan, Step, UnsetVariable, expand, unset_line
from .processes import NOT_EXECUTABLE, NOT_FOUND, descendants, exit_status, signal_catchers, signal_number
from .ranks import node_ids, runtime_values, task_ids
from .run_files import node_exit, write_whole
from .stacks import STACKS_SIGNAL, sizes

PASS_ON_EVERY_S = 0.5  # while preempted: how often the processes below are looked at again


def task_environment(step: Step, environ: Mapping[str, str]) -> Dict[str, str]:
    """The program's environment: the inherited one, the rank variables the step asks for, and the
    step's env values with their run-time values filled in."""
    env = dict(environ)
    env.update(task_ids(env) if step.ranks == "task" else node_ids(env) if step.ranks == "node" else {})
    values = runtime_values(env)
    for name in step.env_expand:
        if name in env:
            env[name] = expand(env[name], values)
    return env


def task_argv(step: Step, environ: Mapping[str, str]) -> List[str]:
    values = runtime_values(environ)
    return [expand(word, values) if index in step.expand else word for index, word in enumerate(step.argv)]


def run_task(plan: LaunchPlan, step: Step, environ: Mapping[str, str]) -> int:
    try:
        env = task_environment(step, environ)
        argv = task_argv(step, env)
    except UnsetVariable as unset:
        print(unset_line(unset, step.name, environ.get("SLURMD_NODENAME", "this node")), file=sys.stderr, flush=True)
        _record_end(environ, UNSET_VARIABLE)
        return UNSET_VARIABLE
    if step.replace:
        return _replace_with(argv, env)
    preempt = signal_number(plan.recovery.signal)
    started: List[subprocess.Popen] = []  # the program, once it runs
    # The preemption signal, once it came (or before this task started: the supervisor says so):
    # passed to each process below that handles it, also to one that installs its handler later.
    preempted = [env.get("CLUSTERKIT_PREEMPTED") == "1"]
    told: Set[int] = set()

    def pass_on(signum: int, _frame: object) -> None:
        preempted[0] = True
        tell()

    def tell() -> None:
        for child in started:
            waiting = [pid for pid in [child.pid, *descendants(child.pid)] if pid not in told]
            told.update(signal_catchers(waiting, preempt))

    # Every rank's stacks asked for (the supervisor signals the whole step): once the ranks that
    # registered have written theirs, py-spy (where installed) dumps those that did not.
    folder = env.get("CLUSTERKIT_STACKS_DIR")
    asked: List[Optional[Tuple[float, Dict[str, int]]]] = [None]

    def stacks_asked(_signum: int, _frame: object) -> None:
        if folder:
            asked[0] = (time.monotonic(), sizes(Path(folder)))

    def stop(signum: int, _frame: object) -> None:
        for child in started:
            if child.poll() is None:
                child.send_signal(signum)

    # Installed before the program starts, so that no signal finds this process without them; the
    # program itself starts with the preemption signal ignored or at its default (a handler would
    # not survive exec anyway), set in the child between fork and exec.
    signal.signal(preempt, pass_on)
    if preempt != STACKS_SIGNAL:
        signal.signal(STACKS_SIGNAL, stacks_asked)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signum != preempt:
            signal.signal(signum, stop)
    start_with = signal.SIG_DFL if step.signal_to_launcher else signal.SIG_IGN
    try:
        started.append(subprocess.Popen(argv, env=env, preexec_fn=lambda: signal.signal(preempt, start_with)))
    except OSError as exc:
        return _cannot_start(argv, env, exc)
    child = started[0]
    while True:
        try:
            returncode = child.wait(timeout=PASS_ON_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            if preempted[0]:
                tell()  # a rank that has installed its handler since
            request = asked[0]
            if folder and request is not None and time.monotonic() - request[0] >= pyspy.GRACE_S:
                asked[0] = None
                pyspy.fill_in(
                    child.pid, Path(folder), env.get("SLURM_NODEID", "-"), pyspy.answered_pids(Path(folder), request[1])
                )
    code = exit_status(returncode)
    _record_end(env, code)
    return code


def _replace_with(argv: List[str], env: Dict[str, str]) -> int:
    """exec the program in this process's place (a task per rank running task.program): srun's task
    is then the program itself, which gets srun's signals and whose exit is the task's. Returns only
    when it cannot be started; nothing records its end (no process of clusterkit's is left)."""
    # Python starts with SIGPIPE and SIGXFSZ ignored, and an ignored signal stays ignored across exec:
    # the program gets them at their default, as from a shell. The preemption signal is at its default
    # already (this process installed no handler), so a program arms its own.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)  # a bare name from the task's PATH, a path with '/' as it is
    except OSError as exc:
        return _cannot_start(argv, env, exc)


def _cannot_start(argv: List[str], env: Mapping[str, str], exc: OSError) -> int:
    code = NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
    print(
        f"clusterkit: cannot start {argv[0]!r} on {env.get('SLURMD_NODENAME', 'this node')}: {exc.strerror or exc}",
        file=sys.stderr,
        flush=True,
    )
    _record_end(env, code)
    return code


def _record_end(env: Mapping[str, str], code: int) -> None:
    run_dir, node = env.get("RUN_DIR"), env.get("SLURM_NODEID")
    if not run_dir or node is None:
        return
    path = Path(run_dir) / node_exit(node)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, f"{time.time():.6f} {code}\n")  # tasks of one node write the same record: each whole
    except OSError as exc:
        print(
            f"clusterkit: cannot record how node {node}'s program ended in {path}: {exc.strerror}",
            file=sys.stderr,
            flush=True,
        )

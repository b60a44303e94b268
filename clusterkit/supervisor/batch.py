"""The batch shell's part of the job, after its environment and setup lines: the plan carried out.

In order: the run directory made ready (an earlier attempt's outcome cleared, an array task's files
brought in), the allocation's hosts and the rendezvous, the hostfile, the ``pre_launch`` hooks, the
image check, the service and its readiness, the preflight, the launch, then the outcome: the exit
code, the ``post_run`` hooks, a requeue or a retry, and the secrets file's end when the run ends.
The preemption signal SLURM sends this process is passed to whichever step is running. While the
launch runs, the supervisor watches it (:mod:`.watchdog`): it takes every rank's stacks when asked
(SIGWINCH, from ``clusterkit stacks``) and, with a watchdog, when the launch stops making progress.
The job's events (its start, failure, hang, restart, completion) go to the recipe's webhook
(:mod:`.notify`), never holding the job up: its end waits a few seconds at most for them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import components, container_setup, hooks, job_steps, ray_cluster, recovery
from .environment import JobEnvironment
from .notify import Notifier
from .plan import PLAN_FORMAT, UNSET_VARIABLE, LaunchPlan, Step, UnsetVariable, unset_line
from .processes import NOT_EXECUTABLE, NOT_FOUND, signal_number
from .run_files import (
    EXIT_CODE,
    HANG_RECORD,
    HEARTBEAT,
    HOSTFILE,
    LAUNCH_PLAN,
    NCCL_TRACE_DIR,
    NCCL_TRACE_ENV,
    PREEMPTED_RECORD,
    REQUEUED,
    SITE_DIR,
    STACKS_DIR,
    SUPERVISOR_DIR,
    write_whole,
)
from .spares import Restart, Spares
from .stacks import STACKS_SIGNAL
from .steps import Running, batch_argv, free_port, start, step_hosts
from .watchdog import EXIT_HUNG, Watcher


class Supervisor:
    def __init__(self, plan: LaunchPlan, job: JobEnvironment, files_dir: Path, run_dir: Path) -> None:
        self.plan, self.job, self.files_dir, self.run_dir = plan, job, files_dir, run_dir
        self.env: Dict[str, str] = dict(job.environ)
        self.hosts: List[str] = []
        self.running: Optional[Running] = None
        self.preempt_signal = signal_number(plan.recovery.signal)
        self.preempted = False  # the signal came: every step started from now on gets it too
        self.watcher: Optional[Watcher] = None
        self.spares = Spares(plan, run_dir, job.job_id)
        self.notifier = Notifier(plan.notify, job.environ, plan.job_name, job.job_id, str(run_dir))
        self.container_made = False  # enroot: the job's container was made (or tried) on the nodes

    def run(self) -> int:
        try:
            return self._carry_out()
        finally:
            self._container_down()
            self.notifier.finish()

    def _carry_out(self) -> int:
        signal.signal(self.preempt_signal, self._pass_on)  # first: by default it would end this process
        signal.signal(STACKS_SIGNAL, self._stacks_asked)
        self._prepare_run_dir()
        self.hosts = self.job.hosts()
        if len(self.hosts) < self.plan.train_nodes + self.plan.service_nodes:
            print(
                f"clusterkit: the allocation has {len(self.hosts)} nodes, the plan needs "
                f"{self.plan.train_nodes + self.plan.service_nodes}: not training",
                flush=True,
            )
            return self._end(1)
        # What the ranks (and a script of the user's) are told: the rendezvous (_rendezvous), and the
        # preemption signal they may handle and how many requeues the run has.
        self.env.update(
            RUN_DIR=str(self.run_dir),
            CLUSTERKIT_RUN_DIR=str(self.run_dir),
            CLUSTERKIT_JOB_ID=self.job.job_id,
            CLUSTERKIT_PREEMPT_SIGNAL=self.plan.recovery.signal,
            CLUSTERKIT_MAX_REQUEUES=str(self.plan.recovery.max_requeues),
            # Every Python process of the job registers its stack dump (site/sitecustomize.py); a
            # script's ranks may touch the heartbeat at each step (the watchdog's sign of progress).
            CLUSTERKIT_STACKS_DIR=str(self.run_dir / STACKS_DIR),
            CLUSTERKIT_HEARTBEAT=str(self.run_dir / HEARTBEAT),
        )
        site = str(self.run_dir / SUPERVISOR_DIR / SITE_DIR)
        if os.pathsep in site:  # PYTHONPATH cannot name it: the ranks go on without the stack dumps
            print(f"clusterkit: the run directory's path holds {os.pathsep!r}: no stacks from the ranks", flush=True)
        else:
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, self.env.get("PYTHONPATH")]))
        train = self._rendezvous()
        # The NCCL flight recorder (GPU profiles, env.sh) dumps into the run directory; torch makes no folder.
        if self.env.get(NCCL_TRACE_ENV, "").startswith(str(self.run_dir / NCCL_TRACE_DIR) + "/"):
            (self.run_dir / NCCL_TRACE_DIR).mkdir(parents=True, exist_ok=True)
        print(f"clusterkit: restart {self.job.restarts} of at most {self.plan.recovery.max_requeues}", flush=True)

        # enroot's container is made before hooks that run in it, after hooks on the host (what they
        # export, a registry token or ENROOT_* settings, reaches enroot import and create).
        before = (self._pre_launch, self._container_up)
        for ready in reversed(before) if self.plan.hooks_container else before:
            code = ready()
            if code:
                return self._end(code)
        if self.plan.image_check is not None:
            code = self._run(self.plan.image_check)
            if code:
                print(
                    f"clusterkit: the container image cannot run what the launch needs ({code}): not training",
                    flush=True,
                )
                return self._end(code)
        service = components.start_service(self.plan, self.job, self.hosts, str(self.run_dir), self.env)
        if service is False:
            return self._end(1)
        started = self._start_components(train)  # never beside a service (load.component_checks)
        if started is None:
            return self._end(1)
        cluster = None
        try:
            if self.plan.ray is not None:  # launcher: ray: the driver (the launch) runs on it
                cluster = ray_cluster.start(self.plan, self.job, train, str(self.run_dir), self.env)
                if not cluster.ready:  # stopped before the job's end (its hooks, a retry)
                    cluster, unready = None, cluster
                    unready.stop()
                    return self._end(1)
            if self.plan.preflight is not None:
                code = self._preflight(train)
                if code:
                    print(f"clusterkit: preflight failed with {code}: not training", flush=True)
                    slow = recovery.slow_hosts(self.run_dir, self.watcher.hosts)
                    # Slow nodes named: on_slow: exclude retries without them; on_slow: fail stops here.
                    return self._end(
                        code, retry=not slow or self.plan.recovery.slow_nodes_excluded, exclude=slow or None
                    )
                if self.plan.preflight_only:
                    print("clusterkit: preflight only (preflight.only: true): done", flush=True)
                    return self._end(0)
            again = f" (restart {self.job.restarts})" if self.job.restarts else ""
            self.notifier.send("start", f"started on {' '.join(self.watcher.hosts)}{again}")
            code = self._run_steps() if self.plan.steps else self._launch()
        finally:
            if cluster is not None:
                cluster.stop()
            if service:
                service.stop()
                print("clusterkit: service stopped", flush=True)
            components.stop_all(self.job, self.plan.components, started)
        print(f"clusterkit: {'the steps' if self.plan.steps else 'launchers'} exited with {code}", flush=True)
        hang = self.watcher.hang
        if hang is not None:  # ended by the watchdog: retried without the odd ranks' nodes, or not at all
            return self._end(code, retry=hang.retry, exclude=hang.exclude)
        if self.job.can_requeue and (self.run_dir / REQUEUED).exists():
            # A program that requeued its own job (Lightning's auto-requeue): SLURM starts it again.
            print("clusterkit: the job asked SLURM to requeue it: this attempt records no outcome", flush=True)
            self.notifier.send("restart", f"requeued by the job itself (exit code {code})")
            return code
        preempted = recovery.preempted_step(self.run_dir)
        if preempted is None:
            return self._end(code, retry=True)
        if recovery.requeue_if_possible(self.plan, self.job, self.run_dir, preempted):
            limit = self.plan.recovery.max_requeues
            step = f"preempted at step {preempted.get('step')}"
            self.notifier.send("restart", f"{step}: requeued (restart {self.job.restarts + 1} of at most {limit})")
            return 0  # SLURM ends this attempt and starts the next; the secrets file stays for it
        return self._end(code or recovery.EXIT_PREEMPTED)  # stopped to be resumed: never retried

    def _rendezvous(self) -> List[str]:
        """Training's hosts now (the allocation's first, without a dropped node), its master and
        port, the hostfile, and the watcher that knows them."""
        train = step_hosts(self.plan, self.plan.launch, self.spares.usable(self.hosts))
        master = train[0]
        port = self.plan.master_port or free_port(self.job.slurm_job_id, master)
        self.env.update(MASTER_ADDR=master, MASTER_PORT=str(port))
        write_whole(
            self.run_dir / HOSTFILE,
            "".join(f"{host} slots={self.plan.slots_per_node}\n" for host in dict.fromkeys(train)),
        )
        self.watcher = Watcher(self.plan, self.job, self.run_dir, train, self.notifier.send)
        print(
            f"clusterkit: job {self.job.slurm_job_id} on {' '.join(self.hosts)} master {master}:{port}, "
            f"run dir {self.run_dir}",
            flush=True,
        )
        return train

    def _preflight(self, train: List[str]) -> int:
        """The preflight; where it names slow nodes that may be left out (on_slow: exclude) and spares
        can take their places, again without them."""
        while True:
            code = self._run(self.plan.preflight)
            slow = recovery.slow_hosts(self.run_dir, train) if code else []
            if not slow or not self.plan.recovery.slow_nodes_excluded:
                return code
            restart = self.spares.replace(self.hosts, train, slow, f"the preflight found {', '.join(slow)} slow")
            if restart is None:
                return code
            self._restarted(restart)
            train = self._rendezvous()

    def _restarted(self, restart: Restart) -> None:
        print(
            f"clusterkit: restart {restart.number} of at most {self.plan.recovery.max_restarts} on a spare "
            f"node: {restart.why}; dropping {', '.join(restart.dropped)}",
            flush=True,
        )
        self.notifier.send("restart", f"restart {restart.number} on a spare node: {restart.why}")

    def _launch(self) -> int:
        """The launch step; where it fails on a node and a spare is left, again on the spare, in
        this job, from the newest complete checkpoint (the runner resumes by itself)."""
        while True:
            train = step_hosts(self.plan, self.plan.launch, self.spares.usable(self.hosts))
            code = self._run(self.plan.launch)
            hang = self.watcher.hang
            if code == 0 or recovery.preempted_step(self.run_dir) is not None or (self.run_dir / REQUEUED).exists():
                return code
            if hang is not None and not hang.retry:
                return code  # watchdog.action: fail ends the job
            if hang is not None:
                why = f"the launch hung; the ranks on {', '.join(hang.exclude)} were elsewhere than the others"
                restart = self.spares.replace(self.hosts, train, hang.exclude, why)
            else:
                restart = self.spares.replace(self.hosts, train, why=f"the launch exited with {code}")
            if restart is None:
                return code
            self._restarted(restart)
            try:
                (self.run_dir / HANG_RECORD).unlink()  # the hang, if that was why, is now a restart's
            except FileNotFoundError:
                pass
            self._rendezvous()
            self.watcher.on_first_progress = self.spares.resumed

    def _run_steps(self) -> int:
        """A job of several steps: each in turn, told its name and trial (``{trial}``); the first
        failure ends them, as does a preemption (the requeued job goes on from that step)."""

        def interrupted() -> bool:
            return recovery.preempted_step(self.run_dir) is not None or (self.run_dir / REQUEUED).exists()

        def run(step: Step, trial: int) -> int:
            return self._run(step, {"CLUSTERKIT_STEP": step.name, "CLUSTERKIT_TRIAL": str(trial)})

        return job_steps.run_steps(self.plan, self.run_dir, self.job.job_id, run, interrupted)

    def _prepare_run_dir(self) -> None:
        # How an earlier attempt in this run directory ended (before a requeue, or a chain's previous
        # link) is not how this one ends.
        for name in (EXIT_CODE, PREEMPTED_RECORD, REQUEUED, HANG_RECORD):
            try:
                (self.run_dir / name).unlink()
            except FileNotFoundError:
                pass
        if self.files_dir.resolve() == self.run_dir.resolve():
            return
        # An array task runs in <array dir>/<task>: what its ranks and nodes read is copied in.
        for name in (*self.plan.rank_files, LAUNCH_PLAN):
            shutil.copyfile(self.files_dir / name, self.run_dir / name)
        shutil.copytree(self.files_dir / SUPERVISOR_DIR, self.run_dir / SUPERVISOR_DIR, dirs_exist_ok=True)

    def _pre_launch(self) -> int:
        if not self.plan.pre_launch:
            return 0
        runtime = self._hooks_runtime()
        if runtime is None:
            return UNSET_VARIABLE
        code, self.env = hooks.pre_launch(self.plan.pre_launch, self.env, runtime)
        if code:
            print(f"clusterkit: hooks.pre_launch exited with {code}: not training", flush=True)
        return code

    def _hooks_runtime(self) -> Optional[List[str]]:
        """hooks.in_container: the runtime's command the hook lines run under, filled in here ([]: on
        the host; None: an {env:NAME} in it is not set, which the job's log says)."""
        step = self.plan.hooks_container
        if step is None:
            return []
        try:
            return batch_argv(step, self.env)
        except UnsetVariable as unset:
            print(unset_line(unset, step.name, socket.gethostname()), flush=True)
            return None

    def _container_up(self) -> int:
        """enroot: the job's container made on every node, before anything runs in it."""
        if self.plan.container_setup is None:
            return 0
        self.container_made = True
        return container_setup.make(self.plan.container_setup, self.run_dir, self._on_every_node)

    def _container_down(self) -> None:
        if self.plan.container_setup is not None and self.container_made:
            container_setup.remove(self.plan.container_setup, self.run_dir, self._on_every_node)

    def _on_every_node(self, step: Step) -> int:
        """A step of one task per node on each usable node of the allocation (hosts: all), or on the first."""
        nodes = 1 if step.hosts == "first" else len(self.spares.usable(self.hosts))
        return self._run(dataclasses.replace(step, nodes=nodes))

    def _pass_on(self, signum: int, _frame: object) -> None:
        self.preempted = True
        if self.running is not None:
            self.running.preempt(signum)

    def _stacks_asked(self, _signum: int, _frame: object) -> None:
        if self.watcher is not None:
            self.watcher.asked = True

    def _run(self, step: Step, told: Optional[Dict[str, str]] = None) -> int:
        # A signal that came before this step: its node agents pass it on once the ranks handle it.
        env = dict(self.env, **(told or {}), **({"CLUSTERKIT_PREEMPTED": "1"} if self.preempted else {}))
        try:
            self.running = start(self.plan, step, self.job, self.spares.usable(self.hosts), str(self.run_dir), env)
        except UnsetVariable as unset:
            print(unset_line(unset, step.name, socket.gethostname()), flush=True)
            return UNSET_VARIABLE
        except OSError as exc:  # srun, or a launcher run here in the batch shell (a front end of yours)
            what = exc.filename or step.argv[0]
            print(f"clusterkit: cannot start {what!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
            return NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
        try:
            if step is self.plan.launch and self.watcher is not None:
                return self.watcher.watch(self.running)
            return self.running.wait()
        finally:
            self.running = None

    def _start_components(self, train: List[str]) -> Optional[List[Running]]:
        """A heterogeneous job's components started and ready ([] for none), every process told where
        each runs; None where one has no nodes, cannot start or never answers."""
        if not self.plan.components:
            return []
        placed = components.place(self.plan, self.job)
        if placed is None:
            return None
        self.env.update(components.told(self.plan, train, placed), CLUSTERKIT_COMPONENT=components.TRAIN)
        return components.start_all(self.plan, self.job, placed, str(self.run_dir), self.env)

    def _end(self, code: int, retry: bool = False, exclude: Optional[Sequence[str]] = None) -> int:
        """The attempt's end: its exit code recorded, the post_run hooks, a retry where one is due
        (``retry``: a failure on a node, of the launch or the preflight; not one of the job's own
        making, such as a hook, the image or the service) without the hosts ``exclude`` names (None:
        the node where the failure began), and the secrets file removed where nothing will start
        this run again."""
        write_whole(self.run_dir / EXIT_CODE, f"{code}\n")  # read by `clusterkit status` once SLURM forgot the job
        runtime = self._hooks_runtime() if self.plan.post_run else []
        failed = UNSET_VARIABLE if runtime is None else hooks.post_run(self.plan.post_run, self.env, code, runtime)
        if failed is not None:
            print(f"clusterkit: hooks.post_run exited with {failed}; the job's exit code stays {code}", flush=True)
        usable = self.spares.usable(self.hosts)  # node numbers count the launch's nodes, a dropped one not
        again = code != 0 and retry and recovery.retry(self.plan, self.job, self.run_dir, usable, self.env, exclude)
        why = {EXIT_HUNG: "hung: ended by the watchdog", recovery.EXIT_PREEMPTED: "preempted, not requeued"}
        if code == 0:
            self.notifier.send("completion", "completed (exit code 0)")
        else:
            self.notifier.send("failure", f"failed with exit code {code}" + (f" ({why[code]})" if code in why else ""))
        if again:
            self.notifier.send(
                "restart", f"retry {self.job.retry + 1} of {self.plan.recovery.max_retries}: job {again}"
            )
        if not again and self.plan.secrets_file:
            recovery.end_secrets(self.files_dir / self.plan.secrets_file)
        return code


def main(plan_path: str) -> int:
    from .environment import current
    from .plan import PlanError, load_plan

    path = Path(plan_path)
    try:
        plan = load_plan(path.read_text())
    except (OSError, PlanError) as exc:
        print(
            f"clusterkit: cannot read the launch plan {path}: {exc} (this supervisor reads format {PLAN_FORMAT})",
            flush=True,
        )
        return 1
    run_dir = Path(os.environ["RUN_DIR"])
    return Supervisor(plan, current(), path.parent, run_dir).run()

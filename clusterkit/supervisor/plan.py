"""The launch plan: what the job runs, where and how many times, computed once by clusterkit from the
resolved recipe (``clusterkit.spec.launch_plan`` builds these classes) and read back here from
``plan.json``. One definition for both sides: the renderer and the job share these dataclasses.

Words that hold run-time values (``{rank}``, ``{run_dir}``, ...) are marked by position
(``Step.expand``, ``Step.env_expand``): any other word is passed exactly as written, braces and all.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, Optional, Tuple

PLAN_FORMAT = 1

# Run-time values: name -> where it is first known. The batch shell knows the job's; a node or task
# also knows its own. One pass replaces them (a value that itself holds braces is not expanded again).
# trial: a step's run of a job of several steps (0, 1, ... with repeat; else 0).
BATCH_VALUES = ("job_id", "run_dir", "master_addr", "master_port", "uid", "gid", "trial")
NODE_VALUES = ("node_rank", "hostname")
TASK_VALUES = ("rank", "local_rank")
RUNTIME_VALUES = BATCH_VALUES + NODE_VALUES + TASK_VALUES
# ``{env:NAME}``: the variable NAME of the environment where the value is filled in (the node agent's
# task, or the supervisor for what it runs itself); :func:`.ranks.runtime_values` lists them as "env:NAME".
ENV_PREFIX = "env:"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_PLACEHOLDER = re.compile(r"\{(" + "|".join(RUNTIME_VALUES) + "|" + ENV_PREFIX + ENV_NAME + r")\}")


UNSET_VARIABLE = 2  # the exit code of a step whose {env:NAME} names a variable not set where it runs


class UnsetVariable(ValueError):
    """An ``{env:NAME}`` whose variable is not set where it is filled in: the job cannot run as written."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def unset_line(error: UnsetVariable, step: str, host: str) -> str:
    """The line a job's log gets where an ``{env:NAME}`` cannot be filled in (the job then fails)."""
    return (
        f"clusterkit: {{env:{error.name}}} in the {step} step: the variable {error.name} is not set on {host}; "
        "set it in the job's environment (env:, the cluster profile's env or setup:) or drop the {env:...}"
    )


def expand(text: str, values: Dict[str, str]) -> str:
    """``text`` with each ``{name}`` of ``values`` replaced, in one pass; other braces stay. An
    ``{env:NAME}`` not in ``values`` raises :class:`UnsetVariable` (every variable set is there)."""

    def value(match: "re.Match[str]") -> str:
        name = match.group(1)
        if name in values:
            return values[name]
        if name.startswith(ENV_PREFIX):
            raise UnsetVariable(name[len(ENV_PREFIX) :])
        return match.group(0)

    return _PLACEHOLDER.sub(value, text)


@dataclasses.dataclass(frozen=True)
class Step:
    """One srun step of the job (or, with ``hosts == "batch"``, a program run in the batch shell
    that starts the ranks itself). Each task runs the node agent (:mod:`.node`), which runs ``argv``."""

    name: str  # preflight | service | launch | image-check: logs and messages say it
    # train: the allocation's first train_nodes; service: the last service_nodes; first; batch;
    # all (each node of the allocation); component (a het group's own); rest: training's but the
    # first (Ray's workers)
    hosts: str
    nodes: int
    tasks_per_node: int
    argv: Tuple[str, ...]
    srun: Tuple[str, ...] = ()  # srun's options besides the layout and the logs, as words
    logs: Tuple[str, str] = ("", "")  # srun --output/--error below the run directory (%j, %t as srun fills in)
    expand: Tuple[int, ...] = ()  # argv positions that hold run-time values
    srun_expand: Tuple[int, ...] = ()  # srun positions that hold run-time values (batch ones only)
    env: Dict[str, str] = dataclasses.field(default_factory=dict)  # set for this step's tasks
    env_expand: Tuple[str, ...] = ()  # names in env whose values hold run-time values
    # Which torch.distributed variables the node agent sets from SLURM's: none (the launcher sets
    # them), node (NODE_RANK: a launcher per node), task (RANK, LOCAL_RANK, NODE_RANK: a task per rank).
    ranks: str = "none"
    # The node agent's interpreter where the task runs inside the image (pyxis); () = the supervisor's own.
    agent_python: Tuple[str, ...] = ()
    # The preemption signal reaches the launcher: False for a launcher that would end on it (torchrun,
    # DeepSpeed's and accelerate's ignore it, and their ranks install a handler to receive it).
    signal_to_launcher: bool = True
    agent: bool = True  # each task runs the node agent around argv (a bare check runs without)
    # The node agent sets the task's variables and then execs argv in its own place (task.program per
    # rank): the program is srun's task itself, with nothing of clusterkit's left around it.
    replace: bool = False
    # A launcher in the batch shell that runs srun itself and takes its options as one argument
    # (DeepSpeed's --launcher_args): the flag, and the argv position the word goes to.
    srun_flag: str = ""
    srun_at: int = -1
    repeat: int = 1  # a step of several (LaunchPlan.steps): run this many times in a row, its trials
    het_group: Optional[int] = None  # a heterogeneous job's component: srun --het-group (None: the job's first)

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node


@dataclasses.dataclass(frozen=True)
class Service:
    """The service role: ``step`` on the service nodes, ready once a TCP connect to the first one's
    ``port`` succeeds; training gets ``<host>:<port>`` in ``address_env``."""

    step: Step
    port: int
    ready_timeout_s: int
    address_env: str


@dataclasses.dataclass(frozen=True)
class ContainerSetup:
    """A runtime whose container is made before anything runs in it and removed when the job ends
    (enroot): ``import_`` (one task on the first node, for a registry image), ``create`` and ``remove``
    (one task on each node of the allocation); ``imported``: the file ``import_`` writes below the run
    directory, removed with the container ("" for none)."""

    create: Step
    remove: Step
    import_: Optional[Step] = None
    imported: str = ""


@dataclasses.dataclass(frozen=True)
class Component:
    """A heterogeneous job's component (spec.components): ``step`` on its own nodes (het group
    ``step.het_group``), ready once its first node answers on ``port`` (None: once started)."""

    name: str
    step: Step
    port: Optional[int]
    ready_timeout_s: int


@dataclasses.dataclass(frozen=True)
class RayCluster:
    """launcher: ray: ``head`` on the first training node, ``workers`` on the others (None on one
    node), each task running ``ray start`` through :mod:`.ray_cluster`; the launch (the driver)
    starts once ``check`` (given the head's address, the node count and ``ready_timeout_s``) found
    every node alive in time; every node's Ray is stopped when the driver ends."""

    head: Step
    workers: Optional[Step]
    check: Tuple[str, ...]  # a program in the job's Python (the [ray] extra's)
    ready_timeout_s: int


@dataclasses.dataclass(frozen=True)
class Recovery:
    """What the job does about preemption and failures."""

    signal: str  # the preemption signal's name without SIG (SLURM's --signal=B:<name>@<grace>)
    max_requeues: int
    max_retries: int
    exclude: Tuple[str, ...] = ()  # the recipe's own --exclude hosts: a retry keeps them excluded
    slow_nodes_excluded: bool = False  # preflight.on_slow: exclude: a retry leaves the slow nodes out
    max_restarts: int = 0  # the launch started again on a spare node, in the same job


@dataclasses.dataclass(frozen=True)
class Watchdog:
    """A hung launch: no progress (a new line in metrics.jsonl, or a touch of the heartbeat file)
    for ``no_progress_s`` once it made some, ``startup_s`` before. Then every rank's stacks are taken
    and summarised, and ``action``: stacks (that only), fail (the job ends), retry (it ends and is
    retried without the node of the rank that was elsewhere)."""

    no_progress_s: int
    startup_s: int
    action: str


@dataclasses.dataclass(frozen=True)
class Notify:
    """Which of the job's events go to the webhook whose URL the secret ``webhook_env`` holds (its
    name: the value is read from the job's environment when an event is sent), in ``format``:
    json, slack or teams (:mod:`.notify`)."""

    webhook_env: str
    events: Tuple[str, ...]
    format: str = "json"


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    job_name: str
    job_kind: str  # job | array | chain (clusterkit.spec.layout names each kind's directories)
    train_nodes: int
    slots_per_node: int  # the hostfile's slots=: ranks per node
    launch: Step
    recovery: Recovery
    service_nodes: int = 0
    spare_nodes: int = 0  # between training's nodes and the service's: a failed node's replacements
    master_port: Optional[int] = None  # the recipe's; None: derived from the job id, moved off a busy one
    # Rendered files the ranks read from the run directory; an array task's are copied there from the array's.
    rank_files: Tuple[str, ...] = ()
    image_check: Optional[Step] = None
    service: Optional[Service] = None
    preflight: Optional[Step] = None
    preflight_only: bool = False
    pre_launch: Tuple[str, ...] = ()  # shell lines written on purpose (hooks), run by bash
    post_run: Tuple[str, ...] = ()
    secrets_file: Optional[str] = None  # beside the job script: the 0600 file the batch shell read
    secrets: Tuple[str, ...] = ()  # the names it holds (never their values)
    watchdog: Optional[Watchdog] = None
    notify: Optional[Notify] = None
    # A job of several steps: these run in order instead of ``launch`` (which stays the rendezvous'
    # and the preflight's layout); the first that fails ends the job (:mod:`.job_steps`).
    steps: Tuple[Step, ...] = ()
    container_setup: Optional[ContainerSetup] = None
    # hooks.in_container: the runtime's command the hook lines' bash runs under, in the batch shell
    # (argv and its run-time values' positions: a Step run here); None: they run on the host.
    hooks_container: Optional[Step] = None
    # A heterogeneous job: started before the launch, in order, and stopped when it ends (.components).
    components: Tuple[Component, ...] = ()
    ray: Optional[RayCluster] = None  # launcher: ray: the cluster the launch (its driver) runs on
    format: int = PLAN_FORMAT

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True) + "\n"


class PlanError(ValueError):
    """plan.json is not one this supervisor can read (damaged, or written by another version)."""


def _build(cls: Any, data: Any) -> Any:
    if not isinstance(data, dict):
        raise PlanError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise PlanError(f"{cls.__name__}: unknown fields {unknown}")
    values = {}
    for name, value in data.items():
        kind = str(known[name].type)
        if kind.startswith("Optional[") and value is not None:
            kind = kind[len("Optional[") : -1]
        nested = _NESTED.get(kind)
        if nested is not None and value is not None:
            value = _build(nested, value)
        elif kind in ("Tuple[Step, ...]", "Tuple[Component, ...]") and isinstance(value, list):
            value = tuple(_build(_NESTED[kind[6:-6]], item) for item in value)
        elif kind.startswith("Tuple[") and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise PlanError(f"{cls.__name__}: {exc}") from None


_NESTED = {
    "Step": Step,
    "ContainerSetup": ContainerSetup,
    "Component": Component,
    "RayCluster": RayCluster,
    "Service": Service,
    "Recovery": Recovery,
    "Watchdog": Watchdog,
    "Notify": Notify,
}


def load_plan(text: str) -> LaunchPlan:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PlanError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlanError(
            f"format {data.get('format') if isinstance(data, dict) else None!r}, this supervisor reads {PLAN_FORMAT}"
        )
    return _build(LaunchPlan, data)

"""Which node of a running job ``clusterkit exec`` and ``clusterkit shell`` go into: ``--node``
(an index, 0-based as SLURM_NODEID, or a host name) or ``--rank`` (the node that runs that global
rank), resolved against the job's hosts as its scheduler lists them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clusterkit.errors import UsageError
from clusterkit.runs.logs import Readable, read_run_file
from clusterkit.spec.bounded_read import CONFIG_LIMIT, InputFileError
from clusterkit.spec.layout import LAUNCH_PLAN
from clusterkit.supervisor.plan import LaunchPlan, PlanError, load_plan


@dataclass(frozen=True)
class NodeChoice:
    """``--node`` or ``--rank`` as given (neither: node 0, the batch host)."""

    node: str | None = None  # an index or a host name
    rank: int | None = None

    def words(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"node {self.node or 0}"


def chosen_host(job: str, hosts: Sequence[str], choice: NodeChoice, plan_file: Readable) -> str:
    """The host name of the chosen node among ``hosts`` (the allocation, in SLURM_NODEID order);
    a node or rank the job does not have is one line (exit 2)."""
    if choice.rank is not None:
        return hosts[_rank_node(job, choice.rank, len(hosts), plan_file)]
    node = choice.node or "0"
    if node.isdigit() and node.isascii():
        index = int(node)
        if index < len(hosts):
            return hosts[index]
        raise UsageError(f"job {job} has no node {index}: {_nodes_words(hosts)}")
    if node in hosts:
        return node
    raise UsageError(f"job {job} runs on no host {node!r}: {_nodes_words(hosts)}")


def _nodes_words(hosts: Sequence[str]) -> str:
    names = ", ".join(f"{index} {host}" for index, host in enumerate(hosts))
    return f"its nodes are {names}"


def _rank_node(job: str, rank: int, nodes: int, plan_file: Readable) -> int:
    """The node of global rank ``rank``: ranks are laid out node-major over the training nodes (the
    first of the allocation), ``slots_per_node`` to a node, as the run's plan says."""
    plan = _plan(job, plan_file)
    world = plan.train_nodes * plan.slots_per_node
    if not 0 <= rank < world:
        raise UsageError(f"job {job} has no rank {rank} ({'rank 0' if world == 1 else f'ranks 0-{world - 1}'})")
    node = rank // plan.slots_per_node
    if node >= nodes:  # a plan that does not match its allocation: never a wrong node
        raise UsageError(f"job {job}: rank {rank} is on node {node}, but the job has {nodes} nodes")
    return node


def _plan(job: str, plan_file: Readable) -> LaunchPlan:
    try:
        return load_plan(read_run_file(plan_file, CONFIG_LIMIT, "a launch plan").decode("utf-8", "replace"))
    except (OSError, InputFileError, PlanError) as exc:
        raise UsageError(
            f"job {job}: --rank needs the run's {LAUNCH_PLAN} ({plan_file}: {getattr(exc, 'strerror', None) or exc}); "
            f"give --node instead"
        ) from None

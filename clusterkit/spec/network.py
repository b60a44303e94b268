"""Network/runtime environment per interconnect, each variable with the reason it is set.

Values come from public launch scripts of large runs and the NCCL/PyTorch docs
(shared/reference/network-env.md); the rendered env.sh carries each reason as a comment.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.recipe import EnvEdit, EnvValue
from clusterkit.spec.resolved import ResolvedRecipe
from clusterkit.spec.watchdog import seconds
from clusterkit.supervisor.run_files import NCCL_TRACE_ENV, NCCL_TRACE_PREFIX


@dataclass(frozen=True)
class EnvVar:
    """One line of env.sh: ``export NAME=value``; with ``value`` None, ``unset NAME``, or (with
    ``prepend``/``append``) an export that extends the value NAME has at that point."""

    name: str
    value: str | None
    reason: str
    prepend: str | None = None
    append: str | None = None

    @property
    def is_edit(self) -> bool:
        return self.prepend is not None or self.append is not None


# Environment settings that belong to debugging sessions, not to production jobs.
DEBUG_ENV = {
    "NCCL_DEBUG": {"INFO", "TRACE"},
    "TORCH_DISTRIBUTED_DEBUG": {"DETAIL", "INFO"},
    "CUDA_LAUNCH_BLOCKING": {"1"},
    "NCCL_P2P_DISABLE": {"1"},
}
# Names PyTorch renamed (around 2.2): the old one is ignored by new releases, or fights the new one.
LEGACY_ENV = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_AVOID_RECORD_STREAMS": "TORCH_NCCL_AVOID_RECORD_STREAMS",
}

_ASYNC_ERRORS = EnvVar(
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "1",
    "abort the process group on a collective error or hang instead of waiting for the time limit",
)
_COMMON = (
    _ASYNC_ERRORS,
    EnvVar("NCCL_DEBUG", "WARN", "warnings only; INFO floods logs and belongs to debugging (network.debug: true)"),
)
_NOT_DOCKER = "^docker,lo,veth"
PROFILES: dict[str, tuple[EnvVar, ...]] = {
    "infiniband": (
        EnvVar("NCCL_SOCKET_IFNAME", _NOT_DOCKER, "bootstrap over a real host interface, never docker/loopback/veth"),
        EnvVar(
            "NCCL_IB_TIMEOUT",
            "22",
            "longer IB verbs timeout (NCCL default 18) rides out fabric congestion on large jobs",
        ),
        EnvVar("NCCL_NET_GDR_LEVEL", "PHB", "GPUDirect RDMA when NIC and GPU share a PCIe host bridge"),
    ),
    "roce": (
        EnvVar("NCCL_SOCKET_IFNAME", _NOT_DOCKER, "bootstrap over a real host interface, never docker/loopback/veth"),
        EnvVar("NCCL_IB_GID_INDEX", "3", "RoCE v2 needs the IPv4-mapped GID"),
        EnvVar("NCCL_IB_TIMEOUT", "22", "longer verbs timeout rides out congestion on converged Ethernet"),
    ),
    "efa": (
        EnvVar("FI_PROVIDER", "efa", "libfabric's EFA provider (with the aws-ofi-nccl plugin)"),
        EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA over EFA on p4d/p5"),
        EnvVar("FI_EFA_FORK_SAFE", "1", "data-loader workers fork; keep libfabric fork-safe"),
        EnvVar("FI_EFA_USE_HUGE_PAGE", "0", "avoids ENOMEM when processes fork"),
        EnvVar("NCCL_SOCKET_IFNAME", _NOT_DOCKER, "bootstrap over a real host interface, never docker/loopback/veth"),
    ),
    "slingshot": (
        EnvVar("FI_CXI_DEFAULT_CQ_SIZE", "131072", "large CXI completion queue avoids event-queue overflow"),
        EnvVar("FI_CXI_DISABLE_CQ_HUGETLB", "1", "no hugetlb for the CXI completion queue"),
        EnvVar("CXI_FORK_SAFE", "1", "data-loader workers fork; keep CXI fork-safe"),
        EnvVar("CXI_FORK_SAFE_HP", "1", "fork safety for huge pages too"),
        EnvVar("NCCL_SOCKET_IFNAME", "hsn", "Slingshot high-speed network interfaces"),
    ),
    "ethernet": (
        EnvVar("NCCL_IB_DISABLE", "1", "no InfiniBand here; skip probing the verbs transport"),
        EnvVar("NCCL_SOCKET_IFNAME", _NOT_DOCKER, "use a real host interface, never docker/loopback/veth"),
    ),
    "loopback": (
        EnvVar("NCCL_IB_DISABLE", "1", "single machine: no InfiniBand"),
        EnvVar("NCCL_SOCKET_IFNAME", "lo", "all 'nodes' share this machine's loopback interface"),
        EnvVar("GLOO_SOCKET_IFNAME", "lo", "gloo (CPU) connects over loopback too"),
    ),
}
_DEBUG = (
    EnvVar("NCCL_DEBUG", "INFO", "network.debug: true — NCCL logs transport and topology choices"),
    EnvVar(
        "NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV", "network.debug: true — the subsystems that explain a slow or hung start"
    ),
    EnvVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "network.debug: true — checks collectives match across ranks"),
)


def env_value(value: str | int | float | bool) -> str:
    """How a YAML scalar becomes an environment string (booleans as 1/0, the shell convention)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def env_var(name: str, value: EnvValue, reason: str) -> EnvVar:
    if isinstance(value, EnvEdit):
        return EnvVar(name, None, reason, value.prepend, value.append)
    return EnvVar(name, None if value is None else env_value(value), reason)


def hub_env(profile: ClusterProfile) -> tuple[EnvVar, ...]:
    """Where the job finds hub models: the profile's hf_home, and on an offline profile the switches
    that make every load read that cache only. transformers 5 reads no offline variable of its own
    (huggingface_hub takes TRANSFORMERS_OFFLINE as an old name of HF_HUB_OFFLINE): none is set for it."""
    where = f"cluster profile '{profile.name}'"
    found: tuple[EnvVar, ...] = ()
    if profile.hf_home is not None:
        found += (
            EnvVar("HF_HOME", profile.hf_home, f"{where} hf_home: the shared model cache `clusterkit prefetch` fills"),
            *(
                EnvVar(name, None, f"{where} hf_home decides the cache; an inherited {name} would point elsewhere")
                for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE")
            ),
        )
    if profile.offline:
        found += (
            EnvVar("HF_HUB_OFFLINE", "1", f"{where} is offline: the hub library reads its cache, never the network"),
            EnvVar("HF_DATASETS_OFFLINE", "1", f"{where} is offline: datasets reads its cache, never the network"),
        )
    return found


# PyTorch's NCCL flight recorder: the last collectives of each rank, dumped when one times out. These
# names are read by torch 2.2 to 2.13 (2.13 reads TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE
# first, then these); torch appends the rank number to the dump file's prefix.
TRACE_BUFFER_SIZE = 2000
_FLIGHT_RECORDER = (
    _ASYNC_ERRORS,
    EnvVar(
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        str(TRACE_BUFFER_SIZE),
        "NCCL flight recorder: keep each rank's last collectives (a few MB of host memory)",
    ),
    EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "NCCL flight recorder: dump them when a collective times out"),
    EnvVar(
        NCCL_TRACE_ENV,
        f"{{run_dir}}/{NCCL_TRACE_PREFIX}",
        "NCCL flight recorder: one dump per rank in the run directory (torch appends the rank)",
    ),
)
COLLECTIVE_TIMEOUT_ENV = "CLUSTERKIT_COLLECTIVE_TIMEOUT_S"


def forensics_env(recipe: ResolvedRecipe, profile: ClusterProfile) -> tuple[EnvVar, ...]:
    """What a hung collective leaves behind: on a GPU (NCCL) profile the flight recorder; wherever
    the recipe sets collective_timeout, that timeout in seconds for a script to pass to
    init_process_group (the built-in runner passes it as ddp_timeout)."""
    found = _FLIGHT_RECORDER if profile.accelerator == "gpu" else ()
    if recipe.collective_timeout is not None:
        found += (
            EnvVar(
                COLLECTIVE_TIMEOUT_ENV,
                str(seconds(recipe.collective_timeout)),
                "recipe collective_timeout: how long a rank waits in one collective",
            ),
        )
    return found


def network_env(recipe: ResolvedRecipe, profile: ClusterProfile, clusterkits: tuple[EnvVar, ...] = ()) -> list[EnvVar]:
    """The job's environment in order of precedence applied: interconnect defaults, debug, threads,
    the model hub's cache, ``clusterkits`` (the render's own, such as tracking's), then the profile's
    site settings, the recipe's network.env and the recipe's env (later wins)."""
    neutral = recipe.network.profile == "none"  # nothing of clusterkit's own about the network
    layers: list[tuple[EnvVar, ...]] = [] if neutral else [_COMMON, PROFILES[recipe.network.profile]]
    if recipe.network.debug:
        layers.append(_DEBUG)
    ranks_per_task = recipe.ranks_per_node // recipe.tasks_per_node  # a node's launcher task runs them all
    threads = max(1, recipe.resources.cpus_per_task // ranks_per_task)
    if profile.accelerator == "cpu":
        layers.append((EnvVar("DS_ACCELERATOR", "cpu", "CPU-only nodes: DeepSpeed skips accelerator auto-detection"),))
    layers.append(
        (
            EnvVar(
                "OMP_NUM_THREADS",
                str(threads),
                f"cpus_per_task / ranks per {'task' if recipe.tasks_per_node > 1 else 'node'} = {recipe.resources.cpus_per_task}/{ranks_per_task}: no oversubscribed cores",
            ),
        )
    )
    layers.append(hub_env(profile))
    layers.append(forensics_env(recipe, profile))
    layers.append(clusterkits)
    for source, env in (
        (f"cluster profile '{profile.name}' network_env", profile.network_env),
        (f"cluster profile '{profile.name}' env", profile.env),
        ("recipe network.env", recipe.network.env),
        ("recipe env", recipe.env),
    ):
        layers.append(tuple(env_var(k, v, source) for k, v in sorted(env.items())))
    # A value or an unset replaces what earlier layers said of the name; an edit extends it, so a
    # profile's LD_LIBRARY_PATH prepend and a recipe's both apply, on top of the inherited value.
    chosen: dict[str, list[EnvVar]] = {}
    for layer in layers:
        for var in layer:
            chosen[var.name] = [*chosen.get(var.name, []), var] if var.is_edit else [var]
    return [var for lines in chosen.values() for var in lines]

"""The preflight's result as the table the job log and ``clusterkit preflight`` print."""

from __future__ import annotations

from typing import Any


def format_report(result: dict[str, Any]) -> str:
    lines = [
        f"clusterkit preflight: all-reduce over {result['world_size']} ranks on {result['nodes']} nodes "
        f"({result['backend']}); busbw = algbw * 2(n-1)/n as nccl-tests",
        f"  {'size':>10}  {'time':>10}  {'algbw':>12}  {'busbw':>12}",
    ]
    for row in result["sizes"]:
        busbw = "n/a (1 rank)" if row["busbw_gbps"] is None else f"{row['busbw_gbps']:>8.3f} GB/s"
        lines.append(
            f"  {_size(row['bytes']):>10}  {row['time_s'] * 1e3:>8.2f}ms  {row['algbw_gbps']:>8.3f} GB/s  {busbw:>13}"
        )
    for node in result["per_node"]:
        value = "n/a (one rank per node)" if node["busbw_gbps"] is None else f"{node['busbw_gbps']:.3f} GB/s"
        mark = "  SLOW" if node["node"] in result["slow_nodes"] else ""
        lines.append(f"  node {node['node']} ({node['host']}): intra-node busbw {value}{mark}")
    if result["slow_nodes"]:
        lines.append(
            f"  slow: node {', '.join(map(str, result['slow_nodes']))} below {result['slow_fraction']:.0%} "
            f"of the median node (on_slow: {result['on_slow']})"
        )
    return "\n".join(lines)


def _size(count: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} B"

"""``clusterkit diff``: what differs between two runs, grouped: the resolved recipe key by key, the
cluster profile, the environment, the code snapshot, the nodes, and the outcome (loss at the same
steps, throughput, time lost). Only the differences. Pure: the CLI reads the runs
(:mod:`clusterkit.diagnose.run_facts`) and the code folders' file digests.

A value that could be a secret is never shown: a recipe's ``secrets:`` are names only and their
values are in no run file, but an ``env:`` value under a name that looks like a credential
(spec.secrets.TOKEN_LIKE) or one the recipe lists as a secret is written as "(hidden)".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from clusterkit.diagnose.run_report import Report, RunFacts
from clusterkit.diagnose.run_time import BUCKETS
from clusterkit.spec.secrets import looks_secret

HIDDEN = "(hidden)"
ABSENT = "(not set)"
LOST = tuple(bucket for bucket in BUCKETS if bucket in ("requeues", "retries", "restarts", "hangs"))
LOSS_STEPS_SHOWN = 5  # the loss at this many common steps, spread over the run


@dataclass(frozen=True)
class Difference:
    key: str
    a: Any
    b: Any


@dataclass(frozen=True)
class RunDiff:
    a: str  # each run's job id and run directory
    b: str
    groups: dict[str, list[Difference]]  # group -> its differences, only groups that have some


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; a list is one value (its order matters)."""
    if isinstance(value, Mapping) and value:
        found: dict[str, Any] = {}
        for key, inner in value.items():
            found.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {prefix: value}


def _secret(key: str, secret_names: set[str]) -> bool:
    return any(looks_secret(part) or part in secret_names for part in key.split("."))


def _compare(
    a: Mapping[str, Any], b: Mapping[str, Any], secret_names: set[str], skip: tuple[str, ...] = ()
) -> list[Difference]:
    differences = []
    for key in sorted(set(a) | set(b)):
        if key.startswith(skip) or f"{key}." in skip:
            continue
        parent = f"{key}."  # an empty or unset table on one side: its keys on the other say it
        if a.get(key, b.get(key)) in (None, {}) and any(k.startswith(parent) for k in (*a, *b)):
            continue
        left, right = a.get(key, ABSENT), b.get(key, ABSENT)
        if left == right:
            continue
        if _secret(key, secret_names):
            left, right = (HIDDEN if v != ABSENT else v for v in (left, right))
        differences.append(Difference(key, left, right))
    return differences


def _loss_at_steps(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[Difference]:
    """The loss of each run at steps both logged (the newest value of a step logged twice, after a
    resume): a few, spread from the first common step to the last."""

    def losses(metrics: list[dict[str, Any]]) -> dict[int, float]:
        return {
            m["step"]: m["loss"]
            for m in metrics
            if m.get("event") == "log" and isinstance(m.get("step"), int) and isinstance(m.get("loss"), (int, float))
        }

    left, right = losses(a), losses(b)
    common = sorted(set(left) & set(right))
    if not common:
        return (
            [Difference("loss", "no step logged by both runs" if left and right else "n/a", "")]
            if left or right
            else []
        )
    picks = sorted(
        {common[round(i * (len(common) - 1) / max(1, LOSS_STEPS_SHOWN - 1))] for i in range(LOSS_STEPS_SHOWN)}
    )
    return [Difference(f"loss at step {step}", left[step], right[step]) for step in picks if left[step] != right[step]]


def _median(metrics: list[dict[str, Any]], key: str) -> float | None:
    values = [m[key] for m in metrics if m.get("event") == "log" and isinstance(m.get(key), (int, float))]
    return statistics.median(values) if values else None


def run_diff(
    a: RunFacts,
    b: RunFacts,
    reports: tuple[Report, Report],
    hosts: tuple[list[str], list[str]] = ([], []),
    code_files: tuple[dict[str, str], dict[str, str]] | None = None,
) -> RunDiff:
    """``hosts``: each run's nodes (its hostfile); ``code_files``: each code snapshot's files and
    their digests, where both are readable here."""
    secret_names: set[str] = set()
    for facts in (a, b):
        if facts.job is not None:
            secret_names.update(facts.job.recipe.secrets)
    groups: dict[str, list[Difference]] = {}

    def recipe_part(facts: RunFacts, part: str) -> dict[str, Any]:
        if facts.job is None:
            return {}
        return _flat(msgspec.to_builtins(getattr(facts.job, part)))

    recipe_a, recipe_b = recipe_part(a, "recipe"), recipe_part(b, "recipe")
    groups["recipe"] = _compare(recipe_a, recipe_b, secret_names, skip=("env.",))
    groups["environment"] = _compare(
        {k: v for k, v in recipe_a.items() if k.startswith("env.")},
        {k: v for k, v in recipe_b.items() if k.startswith("env.")},
        secret_names,
    )
    groups["cluster profile"] = _compare(recipe_part(a, "profile"), recipe_part(b, "profile"), secret_names)
    if a.job is None or b.job is None:
        missing = [f"{f.record.job_id}: {f.problems.get('job.json', 'no job.json')}" for f in (a, b) if f.job is None]
        groups["recipe"].insert(0, Difference("(job.json)", "; ".join(missing), ""))
    code = [
        Difference(field, getattr(a.record, field), getattr(b.record, field))
        for field in ("code_from", "code_commit", "code_dirty")
        if getattr(a.record, field) != getattr(b.record, field)
    ]
    if code_files is not None:
        left, right = code_files
        code += [
            Difference(f"file {name}", "differs" if name in left else ABSENT, "differs" if name in right else ABSENT)
            for name in sorted(set(left) | set(right))
            if left.get(name) != right.get(name)
        ]
    groups["code"] = code
    nodes = [
        Difference(field, getattr(a.record, field), getattr(b.record, field))
        for field in ("scheduler", "nodes", "ranks_per_node", "spare_nodes", "launcher", "cluster")
        if getattr(a.record, field) != getattr(b.record, field)
    ]
    if hosts[0] != hosts[1]:
        nodes.append(Difference("hosts", ",".join(hosts[0]) or "n/a", ",".join(hosts[1]) or "n/a"))
    groups["nodes"] = nodes
    outcome = _loss_at_steps(a.metrics, b.metrics)
    for key in ("samples_per_s", "tokens_per_s"):
        left, right = _median(a.metrics, key), _median(b.metrics, key)
        if left != right:
            outcome.append(Difference(f"median {key.replace('_per_s', '/s')}", left, right))
    for name in ("gpu_hours", "wall"):
        left, right = getattr(reports[0], name).value, getattr(reports[1], name).value
        if left != right:
            outcome.append(Difference(name.replace("_", " ") + (" (s)" if name == "wall" else ""), left, right))
    lost = [sum(s.seconds for s in report.shares if s.bucket in LOST) for report in reports]
    if lost[0] != lost[1]:
        outcome.append(Difference("time lost (s)", lost[0], lost[1]))
    groups["outcome"] = outcome
    return RunDiff(
        f"{a.record.job_id} {a.record.run_dir}",
        f"{b.record.job_id} {b.record.run_dir}",
        {name: rows for name, rows in groups.items() if rows},
    )

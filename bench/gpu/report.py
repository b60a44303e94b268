"""results.json as a short Markdown page: the device line, the ablation table, the planner against
measured memory, FSDP2, the node checks, and what failed or missed its goal."""

from __future__ import annotations

from typing import Any

GIB = 2**30
MFU_GOAL, SPEEDUP_GOAL = 0.45, 3.0


def _gib(value: Any) -> str:
    return f"{value / GIB:.1f}" if isinstance(value, (int, float)) else "–"


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "–"


def findings(data: dict[str, Any]) -> list[str]:
    """The goals of issue 25 that were measured and missed (these do not fail the script)."""
    found = []
    rows = data.get("parts", {}).get("ablation", {}).get("rows", {})
    naive = (rows.get("fp32") or {}).get("tokens_per_s")
    defaults = rows.get("sdpa") or {}
    if defaults.get("mfu") is not None and defaults["mfu"] < MFU_GOAL:
        found.append(f"MFU of clusterkit's defaults {defaults['mfu']:.1%} < {MFU_GOAL:.0%}")
    if naive and defaults.get("tokens_per_s") and defaults["tokens_per_s"] / naive < SPEEDUP_GOAL:
        found.append(
            f"defaults are {defaults['tokens_per_s'] / naive:.2f}x the naive fp32 row, under {SPEEDUP_GOAL:g}x"
        )
    for key, row in rows.items():
        if row.get("status") == "oom":
            found.append(f"ablation {key}: out of memory at micro batch {row.get('micro_batch')} (plan said it fits)")
        elif row.get("oom_at_plan_batch"):
            found.append(
                f"ablation {key}: out of memory at micro batch {row['oom_at_plan_batch']['micro_batch']}, which "
                f"plan said fits; micro batch {row.get('micro_batch')} ran"
            )
    for line in data.get("planner_vs_measured", []):
        if line["within_10pct"] is False:
            ratio = f"{line['ratio']:.2f}x" if line["ratio"] is not None else "not comparable with"
            found.append(f"plan estimate for {line['run']} is {ratio} the measured peak")
    return found


def render(data: dict[str, Any]) -> str:
    device = data.get("device", {})
    versions = (
        f"{data.get('date', '?')} · {device.get('name', '?')} · torch {device.get('torch')} (CUDA {device.get('cuda')}) · "
        f"transformers {device.get('transformers')} · deepspeed {device.get('deepspeed')} · driver {device.get('driver')}"
    )
    peaks = (
        f"bf16 peak for MFU: {device.get('peak_tflops')} TFLOP/s ({device.get('peak_source')}); measured bf16 8192³ "
        f"matmul: {_num(device.get('matmul_bf16_tflops'), '{:.0f}')} TFLOP/s · model N = {_num(data.get('model_params'))}"
        f" · {_num(data.get('elapsed_s'), '{:.0f}')} s"
    )
    lines = [f"# clusterkit GPU proof ({data.get('mode', '?')})", "", versions, peaks, ""]
    lines += _ablation(data) + _planner(data) + _fsdp(data) + _node(data)
    failures, missed = data.get("failures", []), findings(data)
    lines += ["## Failures (the script exits 1)", ""] + ([f"- {f}" for f in failures] or ["none"]) + [""]
    lines += ["## Goals missed (issue 25)", ""] + ([f"- {f}" for f in missed] or ["none"]) + [""]
    return "\n".join(lines)


def _ablation(data: dict[str, Any]) -> list[str]:
    part = data.get("parts", {}).get("ablation", {})
    rows = part.get("rows", {})
    naive = (rows.get("fp32") or {}).get("tokens_per_s")
    lines = [
        "## Seed-004 ablation",
        "",
        "| row | micro x accum | tokens/s | MFU | x fp32 | peak alloc GiB | plan GiB | step s (median) | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in part.get("order", rows):
        row = rows.get(key)
        if row is None:
            continue
        tps = row.get("tokens_per_s")
        steps = sorted(row.get("step_s") or [])
        median = steps[len(steps) // 2] if steps else None
        status = row.get("status", "?") + (f": {row['why']}" if row.get("why") else "")
        lines.append(
            f"| {row['label']} | {row.get('micro_batch', '–')} x {row.get('accumulation', '–')} | {_num(tps)} | "
            f"{_num(row.get('mfu'), '{:.1%}')} | {_num(tps / naive if tps and naive else None, '{:.2f}')} | "
            f"{_gib((row.get('memory') or {}).get('peak_allocated'))} | {_gib((row.get('estimate') or {}).get('total'))} | "
            f"{_num(median, '{:.3f}')} | {status[:160]} |"
        )
    profile = (rows.get("sdpa") or {}).get("profile")
    if profile and "error" not in profile:
        kinds = ", ".join(f"{kind} {seconds:.3f}" for kind, seconds in profile.get("by_kind_s", {}).items())
        busy = _num(profile.get("busy_fraction"), "{:.0%}")
        summary = (
            f"Profile of one optimizer step with the defaults: wall {profile['wall_s']:.3f} s, device busy "
            f"{profile['device_busy_s']:.3f} s ({busy}); seconds by kind: {kinds}."
        )
        lines += ["", summary]
    return lines + [""]


def _planner(data: dict[str, Any]) -> list[str]:
    lines = [
        "## `plan` estimate vs torch.cuda.max_memory_allocated",
        "",
        "| run | layout | plan GiB | plan w/o overhead GiB | measured GiB | plan/measured | within 10% |",
        "|---|---|---|---|---|---|---|",
    ]
    for line in data.get("planner_vs_measured", []):
        lines.append(
            f"| {line['run']} | {line['layout']} | {_gib(line['estimate'])} | {_gib(line['estimate_tensors'])} | "
            f"{_gib(line['measured_peak_allocated'])} | {_num(line['ratio'], '{:.2f}')} | {line['within_10pct']} |"
        )
    offload = data.get("parts", {}).get("planner", {}).get("offload")
    if offload and offload.get("status") != "ok":
        lines.append(f"\nZeRO-2 offload: {offload.get('status')}: {offload.get('why')}")
    return lines + [""]


def _fsdp(data: dict[str, Any]) -> list[str]:
    part = data.get("parts", {}).get("fsdp", {})
    if not part:
        return []
    checks = ", ".join(
        f"{name} {'ok' if ok else 'n/a' if ok is None else 'FAILED'}" for name, ok in part.get("checks", {}).items()
    )
    lines = [
        "## FSDP2 on one GPU",
        "",
        f"checks: {checks or part.get('status', '–')}; checkpoints {part.get('checkpoints')}",
    ]
    if part.get("cpu_refusal"):
        lines.append(f"(rehearsal) validate refused FSDP2 on CPU: {part['cpu_refusal']}")
    return lines + [""]


def _node(data: dict[str, Any]) -> list[str]:
    part = data.get("parts", {}).get("node", {})
    doctor, preflight = part.get("doctor") or {}, part.get("preflight") or {}
    lines = ["## doctor and preflight", ""]
    for check in doctor.get("checks", []):
        lines.append(f"- doctor {check['verdict']}: {check['name']}: {check['detail']}")
    result = preflight.get("result") or {}
    sizes = result.get("sizes") or []
    if sizes:
        largest = sizes[-1]
        lines.append(
            f"- preflight: backend {result.get('backend')}, world {result.get('world_size')}, "
            f"{largest['bytes'] >> 20} MiB all-reduce in {largest['time_s'] * 1e3:.2f} ms"
        )
    elif preflight:
        lines.append(f"- preflight: {preflight.get('error')}")
    job = data.get("parts", {}).get("job", {})
    if job:
        lines.append(f"- local job end to end: {job.get('state', job.get('status'))} ({job.get('seconds', '–')} s)")
    return lines + [""]

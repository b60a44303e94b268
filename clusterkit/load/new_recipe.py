"""``clusterkit new``: a commented recipe for the common starts (your script under torchrun, the
built-in Trainer with a model config, DeepSpeed ZeRO-3), as text the user edits."""

from __future__ import annotations

import json
import re

from clusterkit.errors import UsageError

NAME = re.compile(r"[^A-Za-z0-9._-]+")


def new_recipe(script: str | None, trainer: str | None, nodes: int, gpus: int | None, cluster: str, zero3: bool) -> str:
    if not 1 <= nodes <= 1_000_000 or (gpus is not None and not 1 <= gpus <= 64):
        raise UsageError("--nodes is 1 or more, --gpus 1 to 64")
    if script is not None and (not script.strip() or any(not c.isprintable() for c in script)):
        raise UsageError("--script: a path on one line")
    if script is not None and script.startswith("-"):  # the launcher would read it as one of its options
        raise UsageError(f"--script: {script} reads as an option; write ./{script}")
    if trainer is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", trainer):
        raise UsageError("--trainer: a model type such as gpt2 or llama")
    stem = script.rsplit("/", 1)[-1].rsplit(".", 1)[0] if script else (trainer or "gpt2")
    name = (NAME.sub("-", stem).strip("-._") or "job")[:48] + ("-zero3" if zero3 else "")
    lines = [
        "# A recipe started by `clusterkit new`: edit it, then `clusterkit validate` and `clusterkit render` it.",
        f"name: {name}",
        f"cluster: {json.dumps(cluster)}            # the cluster profile: partition, GPUs, network",
        f"launcher: {'deepspeed' if zero3 else 'torchrun'}" + ("            # one launcher per node" if zero3 else ""),
        "resources:",
        f"  nodes: {nodes}",
    ]
    if gpus is not None:
        lines.append(f"  gpus_per_node: {gpus}            # default: the profile's")
    lines.append('  time: "01:00:00"                # the job\'s time limit')
    if zero3:
        lines += [
            "parallelism:",
            "  zero_stage: 3                   # parameters, gradients and optimizer states sharded",
        ]
    if script is not None:
        lines += [
            "task:",
            f"  script: {json.dumps(script)}    # relative: the directory you submit from",
            "  args: []                        # your script's arguments, one word each",
        ]
    else:
        model = trainer or "gpt2"
        lines += [
            "task:",
            "  trainer:                        # the built-in HF Trainer runner",
            f"    model: {{config: {{model_type: {json.dumps(model)}}}}}   # or pretrained: <hub id>",
            "    # model_type alone is the library's default size; add its dimensions (n_layer, hidden_size...)",
            "    dataset: {type: synthetic, seq_len: 128, num_samples: 1024}",
            "    args: {num_train_epochs: 1, learning_rate: 0.0003}",
        ]
    return "\n".join(lines) + "\n"

"""Every local path in a recipe resolved once, at load, against the directory of the file that
wrote it (a ``--set`` value: the current directory). The resolved recipe holds absolute paths, so
the runner, which starts in another directory, reads the very files validate checked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from clusterkit.errors import Finding
from clusterkit.spec.profile import expanded
from clusterkit.spec.recipe import Recipe

if TYPE_CHECKING:  # annotations only: the profile imports this module into every rank, which needs no YAML
    from clusterkit.load.yaml_source import KeyPath, SourceMap

# The file name every ``--set`` location starts with (see loader.parse_override), and that of
# ``--cluster`` (loader.cluster_override): values given on the command line.
OVERRIDE_PREFIX = "--set "
CLUSTER_PREFIX = "--cluster "
COMMAND_LINE_PREFIXES = (OVERRIDE_PREFIX, CLUSTER_PREFIX)
_LOCAL_PREFIXES = ("./", "../", "/", "~")


def _written_in(source: SourceMap, key: KeyPath) -> Path:
    """The directory a relative path at ``key`` is relative to."""
    location = source.locate(key)
    if location.file.startswith(COMMAND_LINE_PREFIXES):
        return Path.cwd()
    return Path(location.file).absolute().parent


def absolute(text: str, source: SourceMap, key: KeyPath) -> str:
    path = expanded(text)
    return str(path if path.is_absolute() else _written_in(source, key) / path)


def _model_reference(text: str | None, source: SourceMap, key: KeyPath) -> str | None:
    """A pretrained model or tokenizer: a local path when it says so (./ ../ / ~) or exists beside the
    recipe; anything else is a hub name ("gpt2", "org/model") and stays as written."""
    if text is None or not (text.startswith(_LOCAL_PREFIXES) or (_written_in(source, key) / text).exists()):
        return text
    return absolute(text, source, key)


def resolve_local_paths(recipe: Recipe, source: SourceMap) -> tuple[Recipe, list[Finding]]:
    """The recipe with dataset, model, tokenizer, DeepSpeed and accelerate config paths made absolute, and
    what is wrong with the dataset path (missing, or a folder where a file is read)."""
    findings: list[Finding] = []
    deepspeed = recipe.deepspeed
    if isinstance(deepspeed.config, str):
        deepspeed = msgspec.structs.replace(
            deepspeed, config=absolute(deepspeed.config, source, ("deepspeed", "config"))
        )
    accelerate = recipe.accelerate
    if accelerate.config is not None:
        accelerate = msgspec.structs.replace(
            accelerate, config=absolute(accelerate.config, source, ("accelerate", "config"))
        )
    task = recipe.task
    trainer = task.trainer
    if trainer is not None:
        model_key: KeyPath = ("task", "trainer", "model")
        model = trainer.model
        config = (
            absolute(model.config, source, model_key + ("config",)) if isinstance(model.config, str) else model.config
        )
        model = msgspec.structs.replace(
            model,
            config=config,
            pretrained=_model_reference(model.pretrained, source, model_key + ("pretrained",)),
            tokenizer=_model_reference(model.tokenizer, source, model_key + ("tokenizer",)),
        )
        dataset = trainer.dataset
        if dataset.type != "synthetic" and dataset.path is not None:
            key: KeyPath = ("task", "trainer", "dataset", "path")
            dataset = msgspec.structs.replace(dataset, path=absolute(dataset.path, source, key))
            findings.extend(_dataset_findings(dataset.type, trainer.dataset.path, Path(dataset.path), source, key))
        task = msgspec.structs.replace(task, trainer=msgspec.structs.replace(trainer, model=model, dataset=dataset))
    return msgspec.structs.replace(recipe, task=task, deepspeed=deepspeed, accelerate=accelerate), findings


def _dataset_findings(kind: str, written: str, path: Path, source: SourceMap, key: KeyPath) -> list[Finding]:
    location = source.locate(key)
    if not path.exists():
        if expanded(written).is_absolute():
            # An absolute path may live on the cluster's shared filesystem only (validating on a laptop).
            return [
                Finding(location, key, f"{path} is not on this machine; every node of the job must see it", "warning")
            ]
        return [Finding(location, key, f"not found: {path} (a relative path is read from the recipe's folder)")]
    if kind in ("text", "jsonl") and path.is_dir():
        return [
            Finding(
                location, key, f"{path} is a folder; a {kind} dataset is one file (type: disk reads a saved folder)"
            )
        ]
    if kind == "disk" and not path.is_dir():
        return [
            Finding(
                location, key, f"{path} is not a folder; type: disk reads a folder written by datasets' save_to_disk"
            )
        ]
    return []

"""The model hub names a recipe uses and the cache a profile keeps them in; no I/O. Checked by
load.hub_cache (validate's warning) and filled by ``clusterkit prefetch``."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.resolved import ResolvedRecipe

MODEL_KEY = ("task", "trainer", "model")


@dataclass(frozen=True)
class HubRepo:
    """A hub model repository a recipe loads, the recipe key that names it, and the one file whose
    presence in the cache says the repository was fetched (what from_pretrained reads first)."""

    repo_id: str
    key: tuple[str, ...]
    marker: str


def hub_repos(recipe: ResolvedRecipe) -> list[HubRepo]:
    """The hub names among the model and tokenizer (the loader made every local path absolute, so
    what is not is a hub name), each once; the model's own tokenizer comes with the model."""
    trainer = recipe.task.trainer
    if trainer is None:
        return []
    model = trainer.model
    found = []
    for field, name, marker in (
        ("pretrained", model.pretrained, "config.json"),
        ("tokenizer", model.tokenizer, "tokenizer_config.json"),
    ):
        if name and not posixpath.isabs(name) and name not in (repo.repo_id for repo in found):
            found.append(HubRepo(name, MODEL_KEY + (field,), marker))
    return found


def hub_cache_dir(profile: ClusterProfile) -> str | None:
    """The hub cache the profile's jobs read (HF_HOME/hub, as the hub library lays out HF_HOME);
    None: the hub library's own default on this machine."""
    return posixpath.join(profile.hf_home, "hub") if profile.hf_home else None

"""Is each hub model an offline profile's jobs load already in its cache? Asked of the hub library's
own cache lookup (try_to_load_from_cache), never by guessing its folder names. That lookup costs
0.2-0.4 s to import (httpx and more), so it is imported only for an offline profile whose recipe
names a hub model: validate stays fast everywhere else."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from clusterkit.errors import Finding, MissingPackage
from clusterkit.spec.hub import HubRepo, hub_cache_dir, hub_repos
from clusterkit.spec.profile import ClusterProfile
from clusterkit.spec.resolved import ResolvedRecipe

if TYPE_CHECKING:
    from clusterkit.load.yaml_source import SourceMap

HUB_EXTRA = "pip install 'clusterkit[hub]'"


def import_hub():  # -> the huggingface_hub module
    try:
        import huggingface_hub
    except ImportError:
        raise MissingPackage(f"the model hub cache needs huggingface_hub: {HUB_EXTRA}") from None
    return huggingface_hub


def cached_snapshot(repo: HubRepo, cache_dir: str | None) -> str | None:
    """The snapshot folder of the repository's main revision when the cache holds its marker file
    (``cache_dir`` None: the hub library's default cache on this machine)."""
    found = import_hub().try_to_load_from_cache(repo.repo_id, repo.marker, cache_dir=cache_dir)
    # Else None (never fetched) or the library's "known to be missing" sentinel.
    return os.path.dirname(found) if isinstance(found, str) else None


def hub_cache_findings(recipe: ResolvedRecipe, profile: ClusterProfile, source: SourceMap) -> list[Finding]:
    """One warning per hub model an offline profile's job would fail to load (not an error: the cache
    may be on the cluster's shared filesystem only, and validate may run on a laptop)."""
    repos = hub_repos(recipe) if profile.offline else []
    cache_dir = hub_cache_dir(profile)
    findings = []
    for repo in repos:
        try:
            problem = (
                None
                if cached_snapshot(repo, cache_dir)
                else (
                    f"{repo.repo_id!r} is not in the hub cache {cache_dir or 'the hub library keeps by default'} on this "
                    f"machine, and cluster {profile.name!r} is offline: run `clusterkit prefetch` on its login node first"
                )
            )
        except MissingPackage as exc:
            problem = f"cannot check the offline model cache: {exc}"
        except ValueError as exc:  # the hub library's HFValidationError: no repository could have this name
            problem = f"{repo.repo_id!r} is neither a local path nor a hub name ({exc})"
        if problem:
            findings.append(Finding(source.locate(repo.key), repo.key, problem, "warning"))
    return findings

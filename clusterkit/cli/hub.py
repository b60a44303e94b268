"""``clusterkit prefetch RECIPE``: on the login node, fetch the hub models a recipe's jobs load into
the cache its cluster profile's jobs read (hf_home), so ranks on offline compute nodes find them.
Downloads go through huggingface_hub's own snapshot_download, imported only when this command runs."""

from __future__ import annotations

import argparse

from clusterkit.cli.common import print_json, with_json, with_overrides

# Weights in formats a PyTorch run never loads: a repository holding them too would be fetched twice over.
_OTHER_FRAMEWORKS = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.tflite", "onnx/*"]


def cmd_prefetch(args: argparse.Namespace) -> int:
    from clusterkit import api
    from clusterkit.errors import ExternalError, LocatedError
    from clusterkit.load.hub_cache import cached_snapshot, import_hub
    from clusterkit.spec.hub import hub_cache_dir, hub_repos

    loaded = api.load_recipe(args.recipe, args.set)
    repos = hub_repos(loaded.recipe)
    if not repos:
        raise LocatedError(
            f"{loaded.path}: names no hub model (task.trainer.model.pretrained and tokenizer are "
            "local paths or unset): nothing to prefetch"
        )
    # Datasets need nothing here: a recipe reads its dataset from local files only (task.trainer.dataset).
    hub = import_hub()
    cache_dir = hub_cache_dir(loaded.profile)
    fetched = []
    for repo in repos:
        try:
            snapshot = cached_snapshot(repo, cache_dir)
        except ValueError as exc:  # the hub library's HFValidationError: no repository has this name
            raise LocatedError(
                f"{loaded.locate(repo.key)}: {'.'.join(repo.key)}: {repo.repo_id!r} is neither a "
                f"local path nor a hub name ({' '.join(str(exc).split())})"
            ) from None
        status = "cached"
        if snapshot is None:
            try:
                hub.snapshot_download(repo.repo_id, cache_dir=cache_dir, ignore_patterns=_OTHER_FRAMEWORKS)
            except (OSError, ValueError) as exc:  # the hub library's HTTP, offline and name errors
                said = " ".join(str(exc).split()) or type(exc).__name__  # one line
                raise ExternalError(f"downloading {repo.repo_id!r} from the model hub failed: {said}") from None
            # When the hub cannot be reached, snapshot_download quietly returns what the cache already
            # held of the revision: only the marker file now in the cache says the download happened.
            snapshot = cached_snapshot(repo, cache_dir)
            if snapshot is None:
                raise ExternalError(
                    f"downloading {repo.repo_id!r} from the model hub left no {repo.marker} in {cache_dir}"
                )
            status = "downloaded"
        fetched.append({"repo_id": repo.repo_id, "key": ".".join(repo.key), "status": status, "snapshot": snapshot})
    summary = {
        "recipe": str(loaded.path),
        "cluster": loaded.profile.name,
        "offline": loaded.profile.offline,
        "cache_dir": cache_dir or hub.constants.HF_HUB_CACHE,
        "models": fetched,
    }
    if args.json:
        print_json(summary)
        return 0
    for row in fetched:
        said = "already in the cache" if row["status"] == "cached" else "downloaded"
        print(f"{row['repo_id']}: {said}: {row['snapshot']}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prefetch",
        help="on the login node: download a recipe's hub model into its cluster's hf_home for offline compute nodes",
    )
    p.add_argument("recipe", metavar="RECIPE")
    with_json(p)
    with_overrides(p)
    p.set_defaults(func=cmd_prefetch)

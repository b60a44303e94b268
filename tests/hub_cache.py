"""A model hub cache laid out from local files, for tests with no hub to download from.

huggingface_hub has no public API that writes a cache entry from local files (every writer,
hf_hub_download and snapshot_download, fetches from an endpoint), so this lays one out exactly as
the hub's cache documentation specifies — ``models--<org>--<name>/`` with ``blobs/<hash>``,
``snapshots/<commit>/<file>`` as relative links to the blobs and ``refs/main`` holding the commit —
and the tests then check that huggingface_hub's own scan_cache_dir and try_to_load_from_cache
recognise it before relying on it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # a revision's commit hash: 40 hex digits


def cache_folder(hub_cache: Path, repo_id: str, folder: Path, commit: str = COMMIT) -> Path:
    """Put every file of ``folder`` (e.g. save_pretrained's output) into ``hub_cache`` as the main
    revision of model repository ``repo_id``; returns the snapshot folder."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for source in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / source.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot

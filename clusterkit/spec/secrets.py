"""Secrets: environment variables whose values the ranks need (API keys, tokens) and that no file
clusterkit renders, prints or records may hold. A recipe names them only (``secrets: [HF_TOKEN]``);
their values are read at submit (:mod:`clusterkit.launch.secret_values`)."""

from __future__ import annotations

import fnmatch

# Names that look like credentials: a recipe's env: value under such a name is written in plain text
# into job.sbatch, env.sh and recipe.resolved.yaml, so it is warned about.
TOKEN_LIKE = ("*_TOKEN", "*_API_KEY", "*_SECRET", "*PASSWORD*")


def looks_secret(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), pattern) for pattern in TOKEN_LIKE)

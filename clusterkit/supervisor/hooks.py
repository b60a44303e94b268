"""The recipe's hooks: shell lines written on purpose, run by bash as written.

``pre_launch`` lines run before the launch and may export variables for it (a site's token, a path
computed at run time): bash reports its environment when they end, and the launch gets that
environment. They run under ``set -eo pipefail`` as the batch script's own lines did: a failing line
fails the job. ``post_run`` lines run after the launch, failed or not, with its exit code in
``$CLUSTERKIT_EXIT_CODE``; what they do cannot change the job's exit code.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, Mapping, Optional, Sequence, Tuple


def pre_launch(lines: Sequence[str], environ: Mapping[str, str]) -> Tuple[int, Dict[str, str]]:
    """Run the lines; (their exit status, the environment they leave)."""
    if not lines:
        return 0, dict(environ)
    reader, writer = os.pipe()
    # On its way out (an `exit` in the lines too) bash writes its environment into the pipe.
    script = f"trap 'env -0 >&{writer}' EXIT\nset +u\n" + "\n".join(lines) + "\n"
    with os.fdopen(reader, "rb") as exported:
        process = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script], env=dict(environ), pass_fds=(writer,)
        )
        os.close(writer)
        text = exported.read()
    code = process.wait()
    return code, _environment(text) if code == 0 else dict(environ)


def post_run(lines: Sequence[str], environ: Mapping[str, str], exit_code: int) -> Optional[int]:
    """Run the lines; None where they succeeded, else their exit status."""
    if not lines:
        return None
    script = "set +eu\n" + "\n".join(lines) + "\n"
    code = subprocess.run(["bash", "-c", script], env=dict(environ, CLUSTERKIT_EXIT_CODE=str(exit_code))).returncode
    return code or None


# bash's own bookkeeping, not something the lines exported
_BASH_OWN = ("_", "SHLVL")


def _environment(text: bytes) -> Dict[str, str]:
    pairs = (item.decode("utf-8", "surrogateescape").partition("=") for item in text.split(b"\0") if item)
    return {name: value for name, _, value in pairs if name and name not in _BASH_OWN}

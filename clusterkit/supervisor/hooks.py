"""The recipe's hooks: shell lines written on purpose, run by bash as written.

``pre_launch`` lines run before the launch and may export variables for it (a site's token, a path
computed at run time): bash reports its environment when they end, and the launch gets that
environment. They run under ``set -eo pipefail`` as the batch script's own lines did: a failing line
fails the job. ``post_run`` lines run after the launch, failed or not, with its exit code in
``$CLUSTERKIT_EXIT_CODE``; what they do cannot change the job's exit code.

``runtime``: the container runtime's command (hooks.in_container: the tasks' own, filled in) that
bash runs under; the lines then run inside the job's container, and what pre_launch exports stays there.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, Mapping, Optional, Sequence, Tuple


def pre_launch(
    lines: Sequence[str], environ: Mapping[str, str], runtime: Sequence[str] = ()
) -> Tuple[int, Dict[str, str]]:
    """Run the lines; (their exit status, the environment they leave)."""
    if not lines:
        return 0, dict(environ)
    if runtime:  # the container's environment is not the launch's
        script = "set +u\n" + "\n".join(lines) + "\n"
        argv = [*runtime, "bash", "-e", "-o", "pipefail", "-c", script]
        return _run(argv, environ), dict(environ)
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


def post_run(
    lines: Sequence[str], environ: Mapping[str, str], exit_code: int, runtime: Sequence[str] = ()
) -> Optional[int]:
    """Run the lines; None where they succeeded, else their exit status."""
    if not lines:
        return None
    script = "set +eu\n" + "\n".join(lines) + "\n"
    environ = dict(environ, CLUSTERKIT_EXIT_CODE=str(exit_code))
    return _run([*runtime, "bash", "-c", script], environ) or None


def _run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """The exit status; 127 (as bash's) where the runtime's command is not there."""
    try:
        return subprocess.run(list(argv), env=dict(environ)).returncode
    except OSError as exc:
        print(f"clusterkit: cannot start {argv[0]!r} for the hooks: {exc.strerror or exc}", flush=True)
        return 127


# bash's own bookkeeping, not something the lines exported
_BASH_OWN = ("_", "SHLVL")


def _environment(text: bytes) -> Dict[str, str]:
    pairs = (item.decode("utf-8", "surrogateescape").partition("=") for item in text.split(b"\0") if item)
    return {name: value for name, _, value in pairs if name and name not in _BASH_OWN}

"""``hooks:``: shell lines written on purpose, run as written (not under ``set -u``), on the batch node:
in the batch shell, or with ``in_container: true`` inside the job's container (the runtime command the
tasks get; see the containers guide)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, field

from clusterkit.spec.text import LINE_PATTERN

Line = Annotated[str, Meta(pattern=LINE_PATTERN)]


class Hooks(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=False):
    """Shell lines written on purpose, run on the batch node as written (not under ``set -u``)."""

    pre_launch: list[Line] = field(default_factory=list)  # after setup and env, before the launchers
    # After the launchers end, also after a failure; $CLUSTERKIT_EXIT_CODE holds their exit code,
    # which stays the job's whatever these lines do.
    post_run: list[Line] = field(default_factory=list)
    # Both lists run inside the job's container (container:), through the runtime command the tasks
    # get, with the run directory mounted and the job's variables; what pre_launch exports there stays
    # in the container (the launch's environment is the host's).
    in_container: bool = False

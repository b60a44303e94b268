"""``profile:``: a few optimizer steps of the built-in runner recorded on chosen ranks, off by default.

``kind: torch``: the runner records steps A..B with ``torch.profiler`` and writes a Chrome trace and
the key-averages table per listed rank (spec.layout's ``profile_trace``/``profile_table``).
``kind: nsys``: every rank's command is wrapped in ``nsys profile --capture-range=cudaProfilerApi``
and the runner opens the capture range (``torch.cuda.profiler.start``/``stop``) around steps A..B on
the listed ranks only: a launcher starts all its ranks with one command, so the wrapper cannot be
given to some ranks alone, and the rank check is the runner's.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, field

from clusterkit.spec import layout
from clusterkit.spec.launchers import Words
from clusterkit.spec.text import END

STEPS_PATTERN = rf"^\d+(-\d+)?{END}"
STEPS_HINT = "an optimizer step or an inclusive range of them, e.g. 10 or 10-15"
# nsys fills %q{RANK} in from each rank's environment (torchrun and the node agent set RANK).
NSYS_RANK = "%q{RANK}"


class Profiling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Record steps ``steps`` on ranks ``ranks`` of the built-in runner (task.trainer)."""

    kind: Literal["torch", "nsys"]  # torch: torch.profiler's Chrome trace; nsys: Nsight Systems (GPU profiles)
    # The global ranks that record; the others do nothing.
    ranks: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1)] = field(default_factory=lambda: [0])
    # Optimizer steps as the Trainer's global_step counts them (the first is 1): A-B inclusive, or one step.
    steps: Union[int, Annotated[str, Meta(pattern=STEPS_PATTERN)]]

    @property
    def first_last(self) -> tuple[int, int]:
        """(A, B) as written; a single step N is (N, N)."""
        if isinstance(self.steps, int):
            return self.steps, self.steps
        first, _, last = self.steps.partition("-")
        return int(first), int(last or first)


def nsys_wrapper() -> Words:
    """The words before each rank's command; ``{run_dir}`` is filled in by the job. The capture
    range ends with stop (nsys's default, stop-shutdown, would end the rank after step B)."""
    return (
        Words()
        .add("nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--trace=cuda,nvtx,osrt")
        .add("--force-overwrite=true")  # a requeued job that records the steps again replaces its own report
        .add("-o")
        .runtime("{run_dir}/" + layout.nsys_report(NSYS_RANK))
    )

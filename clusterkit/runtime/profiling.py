"""``profile:`` (spec.profiling) in the built-in runner: optimizer steps A..B recorded on the listed
ranks; the other ranks do nothing.

The recording starts and stops at the steps themselves (``on_step_begin`` of the first step in A..B
this job runs, ``on_step_end`` of step B), not by counting ``step()`` calls in a
``torch.profiler.schedule`` from wherever the profiler was created: a run resumed from a checkpoint
starts at that checkpoint's step. The schedule given records every step between (a schedule is what
turns torch's ``ProfilerStep#<N>`` markers on), and the profiler's step count is set to the
Trainer's, so N is the Trainer's step. Each step this job runs inside A..B is recorded, and the files name the steps they hold: a run that
stops inside the range (preempted) or resumes inside it says so, and one that ends before A writes
nothing and says that.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from clusterkit.runtime.rank_exit import fsync_file, write_durably
from clusterkit.spec import layout
from clusterkit.spec.profiling import Profiling

# Rows of the key-averages table written beside a trace.
TABLE_ROWS = 60


def _record_every_step(step: int) -> torch.profiler.ProfilerAction:
    return torch.profiler.ProfilerAction.RECORD


def _say(message: str) -> None:
    print(f"clusterkit: profile: {message}", flush=True)


class StepProfiler(TrainerCallback):
    """Records the steps of ``spec`` on rank ``rank`` (of ``world_size``) into ``run_dir``."""

    def __init__(self, spec: Profiling, rank: int, world_size: int, run_dir: Path):
        self.kind = spec.kind
        self.first, self.last = spec.first_last
        self.rank = rank
        self.listed = rank in spec.ranks
        self.missing = sorted(r for r in spec.ranks if r >= world_size)  # DeepSpeed include/exclude may drop ranks
        self.run_dir = run_dir
        self.recording_from: int | None = None  # the first step of the recording under way
        self.recorded = False
        self._profiler: Any = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.missing and state.is_world_process_zero:
            _say(f"ranks {self.missing} are not in this run ({args.world_size} ranks): nothing is recorded there")

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1  # the optimizer step about to run
        if not self.listed or not self.first <= step <= self.last:
            return
        if self.recording_from is None:
            self._start(step)
        elif self.kind == "torch":
            self._profiler.step()  # ProfilerStep#<step> begins

    def on_step_end(self, args, state, control, **kwargs):
        if self.recording_from is not None and state.global_step >= self.last:
            self._stop(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.recording_from is not None:
            _say(f"training stopped at step {state.global_step}, inside steps {self.first}-{self.last}")
            self._stop(state.global_step)
        elif self.listed and not self.recorded:
            where = "before" if state.global_step < self.first else "after"
            _say(
                f"rank {self.rank}: nothing recorded: this run's steps ended at {state.global_step}, {where} "
                f"steps {self.first}-{self.last}"
            )

    def _start(self, step: int) -> None:
        self.recording_from = step
        if step != self.first:
            _say(f"rank {self.rank}: resumed at step {step}: recording steps {step}-{self.last}")
        if self.kind == "nsys":
            torch.cuda.profiler.start()  # opens nsys's capture range (--capture-range=cudaProfilerApi)
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, with_stack=False, schedule=_record_every_step
        )
        self._profiler.step_num = step  # ProfilerStep#<N> then holds the Trainer's step number
        self._profiler.start()

    def _stop(self, step: int) -> None:
        first, self.recording_from, self.recorded = self.recording_from, None, True
        if self.kind == "nsys":
            torch.cuda.profiler.stop()
            _say(f"rank {self.rank}: steps {first}-{step} captured by nsys")
            return
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        trace = self.run_dir / layout.profile_trace(self.rank, first, step)
        trace.parent.mkdir(parents=True, exist_ok=True)
        staging = trace.with_name(f".{trace.name}.tmp")
        profiler.export_chrome_trace(str(staging))
        fsync_file(staging)
        os.replace(staging, trace)
        sort_by = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=TABLE_ROWS)
        write_durably(self.run_dir / layout.profile_table(self.rank, first, step), table + "\n")
        _say(f"rank {self.rank}: steps {first}-{step} written to {trace}")

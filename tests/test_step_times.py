"""Each rank's step times (clusterkit.runtime.step_times): a real two-rank CPU run with one rank
slowed on purpose is named as the straggler, with no GPU fields on CPU; the GPU fields come from
NVML, here a stand-in module (there is no GPU on this machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from clusterkit.spec import layout
from clusterkit.supervisor.stragglers import straggler
from conftest import REPO

pytest.importorskip("transformers")
from clusterkit.runtime.step_times import GpuSampler, StepTimes  # noqa: E402


@pytest.mark.train
def test_a_rank_slow_to_read_its_data_is_named_and_cpu_lines_have_no_gpu_fields(tmp_path: Path) -> None:
    env = {**os.environ, "SLOW_RANK_FOR_TEST": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests" / "scripts" / "slow_rank_training.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {rank: (tmp_path / layout.step_times(rank)).read_text().splitlines() for rank in (0, 1)}
    records = {rank: [json.loads(line) for line in text] for rank, text in lines.items()}
    assert [r["step"] for r in records[0]] == list(range(1, 9)) == [r["step"] for r in records[1]]
    assert all(set(r) == {"step", "step_s", "data_s", "time"} for rs in records.values() for r in rs)
    assert min(r["data_s"] for r in records[1]) >= 0.25 > max(r["data_s"] for r in records[0])
    found = straggler(tmp_path, ranks_per_node=2, hosts=["here"])
    assert found is not None and (found.rank, found.node) == (1, 0), records
    assert found.summary.startswith("rank 1 on node0 (here) is ")


class _FakeNvml(types.ModuleType):
    """A stand-in for nvidia-ml-py's pynvml (no GPU here): two GPUs, physical 0 and 1."""

    def __init__(self, fail_sampling: bool = False):
        super().__init__("pynvml")
        self.fail_sampling = fail_sampling
        self.asked: list[object] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.asked.append(index)
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.asked.append(uuid)
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle: str):
        if self.fail_sampling:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: str):
        return types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30, free=77 * 2**30)


def _one_step(recorder: StepTimes, step: int = 1) -> dict:
    state = types.SimpleNamespace(global_step=step)
    for _ in recorder.timed(iter([1, 2])):
        pass
    recorder.on_step_begin(None, state, None)
    recorder.on_step_end(None, state, None)
    return json.loads(recorder.path.read_text().splitlines()[-1])


def test_gpu_fields_come_from_nvml_for_the_ranks_own_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    sampler = GpuSampler.open(1)
    assert sampler is not None and fake.asked == [1]  # CUDA's device 1 is the machine's GPU 1 here
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")
    GpuSampler.open(0)
    assert fake.asked[-1] == "GPU-abc"
    line = _one_step(StepTimes(tmp_path / layout.step_times(0), sampler))
    assert (line["gpu_util"], line["gpu_mem_bytes"]) == (87, 3 * 2**30)
    assert line["step"] == 1 and line["data_s"] >= 0 and line["step_s"] >= 0


def test_no_nvml_or_a_failing_gpu_leaves_the_fields_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: the import fails
    assert GpuSampler.open(0) is None
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(fail_sampling=True))
    line = _one_step(StepTimes(tmp_path / layout.step_times(0), GpuSampler.open(0)))
    assert "gpu_util" not in line and "gpu_mem_bytes" not in line


def test_sampled_every_n_steps_and_data_time_reset_each_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    recorder = StepTimes(tmp_path / layout.step_times(2), GpuSampler.open(0), gpu_every=2)
    lines = [_one_step(recorder, step) for step in (1, 2, 3)]
    assert ["gpu_util" in line for line in lines] == [False, True, False]
    recorder.on_step_begin(None, types.SimpleNamespace(global_step=4), None)
    recorder.on_step_end(None, types.SimpleNamespace(global_step=4), None)  # no fetch this step
    assert json.loads(recorder.path.read_text().splitlines()[-1])["data_s"] == 0

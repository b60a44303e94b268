"""``clusterkit gpus``, ``submit --test-only`` and pending reasons in ``status``, in-process against a
fake Host that answers with sinfo, sbatch --test-only and squeue lines captured from the dev cluster
(SLURM 22.05.8) and constructed ones (typed GRES, drained nodes, several partitions, hostile names)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusterkit.cli import gpus as gpus_cli
from clusterkit.cli.parser import run as run_cli_in_process
from clusterkit.runs.pending_reasons import PENDING_REASONS, pending_reason
from clusterkit.runs.record import RunRecord
from clusterkit.runs.status import slurm_status
from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.slurm import SlurmScheduler
from clusterkit.schedulers.slurm_partitions import (
    Asked,
    fit,
    gpu_gres,
    partitions,
    read_sinfo,
    sinfo_argv,
)
from clusterkit.schedulers.slurm_test_only import read_estimate, refusal

REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "recipes" / "tiny-gpt2-cpu.yaml")

# `sinfo --noheader --Node --Format=...` on the idle dev cluster, as it printed it.
SINFO_DEV = """\
node1|debug|debug*|idle|gpu:2|gpu:0|2|infinite|
node2|debug|debug*|idle|gpu:2|gpu:0|2|infinite|
node3|debug|debug*|idle|gpu:2|gpu:0|2|infinite|
"""
# Constructed: typed GRES with sockets, a node with two GPU types, drained/down/not responding nodes
# with their GPUs unused, a partition without GPUs, IDX lists with commas, other GRES kinds, a warning.
SINFO_SITE = """\
h1|h100|h100|mixed|gpu:h100:8(S:0-1)|gpu:h100:6(IDX:0-3,5,7)|96|2-00:00:00|
h2|h100|h100|idle|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|96|2-00:00:00|
h3|h100|h100|drained|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|96|2-00:00:00|
h4|h100|h100|down*|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|96|2-00:00:00|
h5|h100|h100|idle*|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|96|2-00:00:00|
m1|mix|mix|allocated|gpu:a100:4(S:0),gpu:v100:2(S:1),mps:400|gpu:a100:4(IDX:0-3),gpu:v100:2(IDX:4-5),mps:0|64|30:00|
c1|cpu|cpu*|idle|(null)|gpu:0|128|1-00:00:00|
c2|cpu|cpu*|idle~|(null)|gpu:0|128|1-00:00:00|
sinfo: warning: a line that is not a node
"""


class FakeHost:
    """A host that answers each program from a table: (returncode, stdout, stderr)."""

    name = "fake"

    def __init__(self, answers: dict[str, tuple[int, str, str]]):
        self.answers, self.calls, self.files, self.removed = answers, [], {}, []

    def run(self, argv, timeout=30.0):
        self.calls.append(list(argv))
        program = next(word for word in argv if word in self.answers)
        return Completed(*self.answers[program])

    def write_file(self, path, text, mode=0o644):
        self.files[path] = (text, mode)

    def remove_tree(self, path):
        self.removed.append(path)

    def open(self, path):
        raise FileNotFoundError(path)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):
    """The fake host every SLURM command of the CLI goes to (gpus and submit --test-only)."""
    fake = FakeHost({"sinfo": (0, SINFO_DEV, ""), "mktemp": (0, "/tmp/tmp.Xy12\n", "")})

    @contextlib.contextmanager
    def opened(profile, accept_new_host_key=False, name=None):
        fake.executor = name
        yield SimpleNamespace(host=fake)

    monkeypatch.setattr(gpus_cli, "cluster_host", opened)
    return fake


def test_sinfo_is_asked_once_untouched_by_the_users_sinfo_settings():
    argv = sinfo_argv()
    assert argv[0] == "env" and argv.index("sinfo") > 0
    for name in ("SINFO_FORMAT", "SINFO_PARTITION", "SINFO_SORT", "SLURM_TIME_FORMAT"):
        assert ["-u", name] == argv[argv.index(name) - 1 : argv.index(name) + 1]
    assert "--Node" in argv and "--noheader" in argv
    assert any(word.startswith("--Format=") and "GresUsed:0|" in word for word in argv)


def test_the_dev_clusters_real_sinfo_is_one_partition_of_three_nodes_with_two_gpus_each():
    (debug,) = partitions(read_sinfo(SINFO_DEV))
    shown = debug.to_json()
    assert (shown["partition"], shown["default"], shown["gpu_types"], shown["gpus_per_node"]) == (
        "debug",
        True,
        [""],
        [2],
    )
    assert (shown["gpus_free"], shown["gpus_total"], shown["nodes_total"], shown["nodes_idle"]) == (6, 6, 3, 3)
    assert shown["time_limit"] == "infinite" and shown["time_limit_minutes"] is None


def test_gres_typed_untyped_several_kinds_and_idx_lists_with_commas():
    assert gpu_gres("gpu:h100:8(S:0-1)") == [("h100", 8)]
    assert gpu_gres("gpu:2") == [("", 2)]
    assert gpu_gres("gpu:(null):0(IDX:N/A)") == [("", 0)]
    assert gpu_gres("gpu:a100:4(S:0),gpu:v100:2(S:1),mps:400") == [("a100", 4), ("v100", 2)]
    assert gpu_gres("gpu:h100:6(IDX:0-3,5,7)") == [("h100", 6)]
    assert gpu_gres("(null)") == [] and gpu_gres("") == [] and gpu_gres("shard:8") == []


def test_drained_down_and_unresponsive_nodes_have_no_free_gpus():
    h100, mix, cpu = partitions(read_sinfo(SINFO_SITE))
    shown = h100.to_json()
    # h1: 8 - 6 used = 2 free; h2: 8 free; h3 drained, h4 down*, h5 idle but not responding: none.
    assert (shown["gpus_free"], shown["gpus_total"]) == (10, 40)
    assert (shown["nodes_idle"], shown["nodes_mixed"], shown["nodes_unavailable"]) == (1, 1, 3)
    assert shown["time_limit_minutes"] == 2 * 1440 and not shown["default"]
    assert mix.gpu_types == ["a100", "v100"] and mix.to_json()["gpus_free"] == 0
    assert mix.to_json()["nodes_allocated"] == 1
    assert cpu.default and cpu.gpus_per_node == [0] and cpu.gpu_types == []
    assert cpu.to_json()["nodes_idle"] == 2  # idle~: powered off, started on demand


def test_a_job_fits_now_later_or_never():
    h100, mix, cpu = partitions(read_sinfo(SINFO_SITE))
    assert fit(h100, Asked(1, 8, "1-00:00:00")).verdict == "now"
    assert fit(h100, Asked(2, 8, None)).verdict == "later"  # h2 only; h3-h5 exist but are out
    never = fit(h100, Asked(6, 8, None))
    assert never.verdict == "never" and "lower resources.nodes" in never.why
    too_long = fit(h100, Asked(1, 1, "3-00:00:00"))
    assert too_long.verdict == "never" and "over the partition's limit 2-00:00:00" in too_long.why
    assert fit(mix, Asked(1, 8, None)).verdict == "never"  # 6 GPUs a node at most
    assert fit(cpu, Asked(2, 0, "60")).verdict == "now"
    assert fit(cpu, Asked(1, 1, None)).verdict == "never"


def test_hostile_partition_names_break_neither_table_nor_json(host: FakeHost, capsys: pytest.CaptureFixture):
    host.answers["sinfo"] = (0, "n1|evil\x1b[2J\x07|evil\x1b[2J\x07*|idle|gpu:1|gpu:0|1|infinite|\nn2|br\neak|x|\n", "")
    assert run_cli_in_process(["gpus"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b[2J\\x07*" in out
    # The header, the one whole line ("br\neak" is no node line) and that the profile's debug is not listed.
    assert len(out.splitlines()) == 3 and "partition debug is not among them" in out
    assert run_cli_in_process(["gpus", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [p["partition"] for p in shown["partitions"]] == ["evil\x1b[2J\x07"]


def test_gpus_prints_the_table_and_json_from_one_sinfo(host: FakeHost, capsys: pytest.CaptureFixture):
    host.answers["sinfo"] = (0, SINFO_SITE, "")
    assert run_cli_in_process(["gpus"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["PARTITION", "GPU", "GPUS/NODE"]
    assert lines[1].split() == ["h100", "h100", "8", "10/40", "1/5", "1", "1", "0", "3", "2-00:00:00"]
    assert lines[2].split()[:3] == ["mix", "a100,v100", "6"]
    assert lines[3].split()[:3] == ["cpu*", "-", "0"]
    assert lines[4] == "cluster profile dev's partition debug is not among them"
    assert len(host.calls) == 1
    assert run_cli_in_process(["gpus", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["recipe"] is None and [p["partition"] for p in shown["partitions"]] == ["h100", "mix", "cpu"]


def test_gpus_with_a_recipe_says_where_it_could_start_and_where_never(host: FakeHost, capsys: pytest.CaptureFixture):
    host.answers["sinfo"] = (0, SINFO_DEV, "")
    assert run_cli_in_process(["gpus", TINY, "--set", "resources.nodes=4"]) == 0
    out = capsys.readouterr().out
    assert "debug (the recipe's): NEVER: 4 nodes x no GPUs asked; it has 3" in out
    assert run_cli_in_process(["gpus", TINY, "--json"]) == 0
    recipe = json.loads(capsys.readouterr().out)["recipe"]
    assert (recipe["partition"], recipe["nodes"], recipe["gpus_per_node"]) == ("debug", 2, 0)
    assert recipe["fits"] == [
        {"partition": "debug", "verdict": "now", "why": "2 nodes x no GPUs: 3 nodes free for it now"}
    ]


def test_gpus_refuses_set_without_a_recipe(host: FakeHost, capsys: pytest.CaptureFixture):
    assert run_cli_in_process(["gpus", "--set", "resources.nodes=2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not host.calls


# --- submit --test-only ---------------------------------------------------------------------------

ESTIMATE = "sbatch: Job 11 to start at 2026-11-27T04:15:34 using 2 processors on nodes node[1-2] in partition debug\n"
REFUSED = "allocation failure: Requested node configuration is not available"  # as sbatch printed it: no newline


def test_the_estimate_and_refusals_as_sbatch_prints_them():
    estimate = read_estimate(ESTIMATE)
    assert estimate is not None and estimate.to_json() == {
        "start": "2026-11-27T04:15:34",
        "processors": 2,
        "nodes": "node[1-2]",
        "partition": "debug",
    }
    said = refusal(
        "sbatch: error: invalid partition specified: no\x1bsuch\nallocation failure: Invalid partition name specified\n"
    )
    assert "\n" not in said and "\x1b" not in said and "resources.partition names no partition" in said


def test_test_only_runs_exactly_the_rendered_job_and_leaves_nothing(
    host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture
):
    host.answers["sbatch"] = (0, "", ESTIMATE)
    runs = tmp_path / "runs"
    code = run_cli_in_process(["submit", TINY, "--test-only", "--executor", "slurm", "--set", f"runs_dir={runs}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "job would start at 2026-11-27T04:15:34 on node[1-2]" in out and "nothing was queued" in out
    sbatch = next(call for call in host.calls if "sbatch" in call)
    assert sbatch[sbatch.index("sbatch") + 1] == "--test-only"
    assert "--parsable" not in sbatch and "--hold" not in sbatch
    assert sbatch[-1] == "/tmp/tmp.Xy12/job.sbatch"
    script, mode = host.files["/tmp/tmp.Xy12/job.sbatch"]
    assert script.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in script and mode == 0o700
    assert host.removed == ["/tmp/tmp.Xy12"] and not runs.exists()  # no run directory, no staging
    assert host.executor == "slurm"  # the request's executor asks
    # The same script submit would send: what --dry-run prints.
    assert run_cli_in_process(["submit", TINY, "--dry-run", "--executor", "slurm", "--set", f"runs_dir={runs}"]) == 0
    assert capsys.readouterr().out == script


def test_test_only_of_a_job_slurm_refuses_is_one_line_exit_2_and_still_cleans_up(
    host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture
):
    host.answers["sbatch"] = (1, "", REFUSED)
    host.answers["sinfo"] = (1, "", "sinfo: error: no answer")  # only sbatch's words are left to tell
    argv = ["submit", TINY, "--test-only", "--executor", "slurm", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Requested node configuration is not available" in err
    assert "lower resources.nodes" in err and host.removed == ["/tmp/tmp.Xy12"]


def test_test_only_says_never_from_the_partition_when_sbatch_would_queue_it(
    host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A time over the partition's limit: a cluster without EnforcePartLimits queues the job, to wait forever."""
    host.answers["sbatch"] = (0, "", ESTIMATE)
    host.answers["sinfo"] = (0, SINFO_DEV.replace("infinite", "5:00"), "")
    argv = ["submit", TINY, "--test-only", "--executor", "slurm", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resources.time 00:10:00 is over the partition's limit 5:00" in err


def test_test_only_with_the_local_executor_is_refused(host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture):
    argv = ["submit", TINY, "--test-only", "--executor", "local", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 2 and not host.calls
    assert "no queue" in capsys.readouterr().err


@pytest.mark.parametrize(
    "said",
    [
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
        "sbatch: error: slurm_persist_conn_open: unable to connect\n",
    ],
)
def test_sbatch_that_cannot_reach_slurm_is_exit_1_not_never(host: FakeHost, tmp_path: Path, capsys, said: str):
    host.answers["sbatch"] = (1, "", said)
    argv = ["submit", TINY, "--test-only", "--executor", "slurm", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 1
    assert "sbatch --test-only failed" in capsys.readouterr().err


# --- pending reasons in status --------------------------------------------------------------------


def test_every_reason_has_meaning_and_advice_and_the_never_ones_say_so():
    for word, reason in PENDING_REASONS.items():
        assert reason.meaning and reason.what_to_do and "\n" not in reason.line(), word
    assert pending_reason("ReqNodeNotAvail, UnavailableNodes:node[1-3]") is PENDING_REASONS["ReqNodeNotAvail"]
    assert pending_reason("SomethingNew") is None and pending_reason(None) is None
    assert PENDING_REASONS["DependencyNeverSatisfied"].never and not PENDING_REASONS["Priority"].never


def test_a_pending_jobs_reason_is_explained_and_a_never_one_flagged():
    waiting = slurm_status({"JobState": "PENDING", "Reason": "Resources", "ExitCode": "0:0"}, None)
    assert waiting.reason == "Resources" and "enough nodes/GPUs" in waiting.explanation and not waiting.never
    never = slurm_status({"JobState": "PENDING", "Reason": "PartitionTimeLimit", "ExitCode": "0:0"}, None)
    assert never.never and "it can never run as it is" in never.explanation
    running = slurm_status({"JobState": "RUNNING", "Reason": "None", "ExitCode": "0:0"}, None)
    assert running.explanation is None and not running.never


def _pending_run(tmp_path: Path) -> RunRecord:
    run_dir = tmp_path / "runs" / "tiny" / "7"
    run_dir.mkdir(parents=True)
    record = RunRecord(
        job_id="7",
        name="tiny",
        scheduler="slurm",
        run_dir=str(run_dir),
        recipe="r.yaml",
        submitted_at=0.0,
        nodes=2,
        ranks_per_node=1,
        launcher="python",
    )
    record.write(run_dir)
    return record


def test_status_of_a_job_that_can_never_run_says_so_in_one_line_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    record = _pending_run(tmp_path)
    fake = FakeHost({"squeue": (0, "7|7|N/A|PENDING|DependencyNeverSatisfied|0|\n", "")})
    monkeypatch.setattr(SlurmScheduler, "__init__", lambda self, host=None: setattr(self, "host", fake))
    assert run_cli_in_process(["status", record.run_dir]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "7  tiny  PENDING  (DependencyNeverSatisfied)"
    never = [line for line in out if "NEVER RUNS" in line]
    assert len(never) == 1 and "--after" in never[0]
    assert run_cli_in_process(["status", record.run_dir, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["reason"] == "DependencyNeverSatisfied" and shown["never"] is True
    assert shown["explanation"].startswith("a job it depends on ended")


def test_json_shapes_are_as_documented(host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture):
    from test_json_shapes import DOCS, differences

    assert run_cli_in_process(["gpus", TINY, "--json"]) == 0
    assert differences(json.loads(capsys.readouterr().out), DOCS["clusterkit gpus --json [RECIPE]"][0]) == []
    host.answers["sbatch"] = (0, "", ESTIMATE)
    argv = ["submit", TINY, "--test-only", "--json", "--executor", "slurm", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert differences(shown, DOCS["clusterkit submit --test-only --json RECIPE"][0]) == []
    assert shown["partition"]["verdict"] == "now"


def test_an_array_or_chain_waiting_tells_its_waiting_tasks_reason():
    from clusterkit.runs.arrays import array_status, chain_status

    def pending(reason):
        return slurm_status({"JobState": "PENDING", "Reason": reason, "ExitCode": "0:0"}, None)

    done = slurm_status({"JobState": "COMPLETED", "Reason": "None", "ExitCode": "0:0"}, None)
    array = array_status([done, pending("BadConstraints"), pending("JobArrayTaskLimit")])
    assert array.state == "RUNNING" and array.reason == "1 COMPLETED, 2 PENDING" and array.never
    assert "constraint" in array.explanation
    chain = chain_status([done, pending("Resources")], done)
    assert chain.reason == "link 2 of 2" and "enough nodes/GPUs" in chain.explanation and not chain.never


@pytest.mark.parametrize("other", ["--dry-run", "--follow"])
def test_test_only_goes_without_dry_run_and_follow(host: FakeHost, tmp_path: Path, capsys, other: str):
    argv = ["submit", TINY, "--test-only", other, "--executor", "slurm", "--set", f"runs_dir={tmp_path}/runs"]
    assert run_cli_in_process(argv) == 2 and not host.calls
    assert capsys.readouterr().err.count("\n") == 1

"""sacct's answer read into typed rows: states, exit codes and signals, times, GPUs from AllocTRES,
requeued instances, and a cluster without accounting in one line."""

from __future__ import annotations

import datetime as dt

from clusterkit.schedulers.host import Completed
from clusterkit.schedulers.slurm_accounting import NoAccounting, job_accounting, read_sacct, sacct_argv

LINES = "\n".join(
    (
        "41|41|PREEMPTED|0:15|2026-11-27T04:00:00|2026-11-27T04:00:05|2026-11-27T04:01:05|60|node[1-2]|billing=4,cpu=4,gres/gpu=4,mem=2G,node=2|debug",
        "41|41|COMPLETED|0:0|2026-11-27T04:01:06|2026-11-27T04:01:36|2026-11-27T04:03:36|120|node[1-2]|billing=4,cpu=4,gres/gpu:h100=4,gres/gpu=4,node=2|debug",
        "43|42_1|FAILED|3:0|2026-11-27T04:00:00|Unknown|Unknown|0|None assigned||debug",
        "44|44|CANCELLED by 0|0:0|2026-11-27T04:00:00|None|None|0|None assigned|cpu=2|debug",
        "45|45|RUNNING|0:0|2026-11-27T04:00:00|2026-11-27T04:00:01|Unknown|7|node3|cpu=1|debug",
        "a line|that is|not a job",
        "46|46|COMPLETED|0:0|x|y|z|1|n|cpu=1|debug|extra",
    )
)


def test_rows_are_read_in_order_with_requeued_instances_kept():
    rows = read_sacct(LINES)
    assert [r.job_id for r in rows] == ["41", "41", "42_1", "44", "45"]
    first, last = rows[0], rows[1]
    assert (first.state, first.exit_code, first.signal, first.gpus, first.cpus) == ("PREEMPTED", None, 15, 4, 4)
    assert (last.state, last.exit_code, last.gpus, last.elapsed_s) == ("COMPLETED", 0, 4, 120)
    assert last.queue_wait_s == 30 and last.gpu_hours == 4 * 120 / 3600
    assert last.ended == dt.datetime(2026, 11, 27, 4, 3, 36)


def test_unknown_times_and_states_with_words_after_them():
    rows = read_sacct(LINES)
    failed, cancelled, running = rows[2], rows[3], rows[4]
    assert (failed.raw_id, failed.state, failed.exit_code, failed.started, failed.gpus) == ("43", "FAILED", 3, None, 0)
    assert failed.queue_wait_s is None
    assert cancelled.state == "CANCELLED" and cancelled.ended is None
    assert running.ended is None and running.nodes == "node3"


class Answers:
    name = "fake"

    def __init__(self, done: Completed):
        self.done, self.argv = done, None

    def run(self, argv, timeout=30.0):
        self.argv = list(argv)
        return self.done


def test_no_accounting_is_one_line_with_sacct_words():
    host = Answers(Completed(1, "", "sacct: error: Slurm accounting storage is disabled\n"))
    said = job_accounting(host, ["5"])
    assert isinstance(said, NoAccounting)
    assert said.why == "sacct: error: Slurm accounting storage is disabled" and "\n" not in said.line


def test_the_users_sacct_settings_do_not_apply_and_ids_are_one_argument():
    host = Answers(Completed(0, LINES, ""))
    assert len(job_accounting(host, ["45", "41", "41"])) == 5
    assert host.argv == sacct_argv(["41", "45"])
    assert ["-u", "SACCT_FORMAT"] == host.argv[1:3] and "--duplicates" in host.argv and "--jobs=41,45" in host.argv
    assert job_accounting(host, []) == []


# Captured from the dev cluster (bin/dev-cluster, slurmdbd 22.05 over MariaDB): `exit 3`; two nodes with
# a GPU each; a two-task array exiting with its index; a batch shell that killed itself (signal 9).
# sacct --parsable2 puts no "|" after the last value.
DEV_CLUSTER = """\
1|1|FAILED|3:0|2026-11-27T04:14:27|2026-11-27T04:14:29|2026-11-27T04:14:29|0|node1|billing=1,cpu=1,node=1|debug
2|2|COMPLETED|0:0|2026-11-27T04:14:27|2026-11-27T04:14:29|2026-11-27T04:14:30|1|node[1-2]|billing=2,cpu=2,gres/gpu=2,node=2|debug
4|4|FAILED|0:9|2026-11-27T04:14:27|2026-11-27T04:14:29|2026-11-27T04:14:29|0|node3|billing=1,cpu=1,node=1|debug
5|3_0|COMPLETED|0:0|2026-11-27T04:14:27|2026-11-27T04:14:29|2026-11-27T04:14:29|0|node2|billing=1,cpu=1,node=1|debug
3|3_1|FAILED|1:0|2026-11-27T04:14:27|2026-11-27T04:14:29|2026-11-27T04:14:29|0|node3|billing=1,cpu=1,node=1|debug
"""


def test_real_sacct_lines_from_the_dev_cluster_are_read():
    rows = {row.job_id: row for row in read_sacct(DEV_CLUSTER)}
    assert list(rows) == ["1", "2", "4", "3_0", "3_1"]
    assert (rows["1"].state, rows["1"].exit_code, rows["1"].nodes) == ("FAILED", 3, "node1")
    assert (rows["2"].gpus, rows["2"].cpus, rows["2"].elapsed_s, rows["2"].nodes) == (2, 2, 1, "node[1-2]")
    assert (rows["4"].exit_code, rows["4"].signal) == (None, 9)
    assert (rows["3_1"].raw_id, rows["3_1"].exit_code) == ("3", 1)

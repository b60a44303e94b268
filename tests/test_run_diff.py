"""``clusterkit diff`` between two run directories built as real runs leave them: only what
differs, grouped (recipe, environment, cluster profile, code, nodes, outcome), and no value that
could be a secret, in text or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_json_shapes import DOCS, differences
from test_run_report import PREEMPTED_METRICS, cli, make_run

SECRET_A, SECRET_B = "hf_secretvalueAAAA", "hf_secretvalueBBBB"


def two_runs(runs: Path):
    a = make_run(
        runs,
        "41",
        metrics=PREEMPTED_METRICS,
        overrides=("cluster=infiniband-h100", f"env.HF_TOKEN={SECRET_A}", "env.PLAIN=one", "secrets=[WANDB_API]"),
        code_from="/src",
        code_commit="a" * 40,
        code_dirty=False,
    )
    slower = [
        {**m, "loss": m["loss"] + 0.5, "samples_per_s": 4.0} if m["event"] == "log" else m for m in PREEMPTED_METRICS
    ]
    b = make_run(
        runs,
        "42",
        metrics=slower,
        overrides=(
            "cluster=infiniband-h100",
            f"env.HF_TOKEN={SECRET_B}",
            "env.PLAIN=two",
            "secrets=[WANDB_API]",
            "task.trainer.args.learning_rate=0.01",
        ),
        code_from="/src",
        code_commit="b" * 40,
        code_dirty=True,
    )
    for record, hosts, source in ((a, "node1\nnode2\n", "x = 1\n"), (b, "node1\nnode3\n", "x = 2\n")):
        (record.path / "hostfile").write_text("".join(f"{h} slots=2\n" for h in hosts.split()))
        (record.path / "code").mkdir()
        (record.path / "code" / "train.py").write_text(source)
        (record.path / "code" / "same.py").write_text("same\n")
    (b.path / "code" / "new.py").write_text("new\n")
    return a, b


def test_only_the_differences_grouped_and_secrets_hidden(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    two_runs(runs)
    code, out, err = cli(capsys, "diff", "41", "42", "--runs-dir", str(runs), "--json")
    assert code == 0, err
    assert SECRET_A not in out and SECRET_B not in out
    assert differences(json.loads(out), DOCS["clusterkit diff --json RUN_A RUN_B"][0]) == []
    groups = {name: {d["key"]: (d["a"], d["b"]) for d in rows} for name, rows in json.loads(out)["groups"].items()}
    assert groups["recipe"] == {"task.trainer.args.learning_rate": (0.001, 0.01)}
    assert groups["environment"] == {"env.HF_TOKEN": ("(hidden)", "(hidden)"), "env.PLAIN": ("one", "two")}
    assert "cluster profile" not in groups, "the same profile: no group"
    assert groups["code"] == {
        "code_commit": ("a" * 40, "b" * 40),
        "code_dirty": (False, True),
        "file train.py": ("differs", "differs"),
        "file new.py": ("(not set)", "differs"),
    }
    assert groups["nodes"] == {"hosts": ("node1,node2", "node1,node3")}
    outcome = groups["outcome"]
    assert outcome["loss at step 30"] == (3.5, 4.0) and outcome["loss at step 60"] == (2.5, 3.0)
    assert outcome["median samples/s"] == (8.0, 4.0)
    code, out, err = cli(capsys, "diff", "41", str(runs / "tiny-gpt2" / "42"), "--runs-dir", str(runs))
    assert code == 0, err
    assert SECRET_A not in out and SECRET_B not in out and "(hidden)" in out
    assert "recipe:" in out and "task.trainer.args.learning_rate" in out and "cluster profile:" not in out


def test_a_run_against_itself_has_no_differences(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    two_runs(runs)
    code, out, _ = cli(capsys, "diff", "41", "41", "--runs-dir", str(runs))
    assert code == 0 and out.splitlines()[-1] == "no differences"


def test_another_profile_and_a_damaged_run(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    a, b = two_runs(runs)
    (b.path / "job.json").write_text("{not json")
    (b.path / "metrics.jsonl").write_bytes(b'\0\xff\n{"event": "log", "step": 30, "loss": "\\u001b[31m"}\n')
    code, out, err = cli(capsys, "diff", "41", "42", "--runs-dir", str(runs), "--json")
    assert code == 0, err
    groups = json.loads(out)["groups"]
    assert "not a clusterkit job file" in groups["recipe"][0]["a"]
    assert SECRET_A not in out, "a secret-like value on one side only is hidden too"
    c = make_run(runs, "43", metrics=PREEMPTED_METRICS, overrides=())
    code, out, err = cli(capsys, "diff", "41", "43", "--runs-dir", str(runs))
    assert code == 0, err
    assert "cluster profile:" in out and "gpu.peak_tflops" in out and SECRET_A not in out
    code, out, _ = cli(capsys, "diff", "41", c.job_id, "--runs-dir", str(runs), "--json")
    groups = {name: {d["key"] for d in rows} for name, rows in json.loads(out)["groups"].items()}
    # A table set on one side only is said by its keys, not as a table that differs from nothing.
    assert "env" not in groups["recipe"] and "gpu" not in groups["cluster profile"]
    assert {"gpu.model", "gpu.peak_tflops"} <= groups["cluster profile"]


def test_control_characters_in_a_value_are_shown_escaped(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    make_run(runs, "1", metrics=[], overrides=())
    make_run(runs, "2", metrics=[], overrides=())
    (runs / "tiny-gpt2" / "2" / "hostfile").write_text("evil\x1b[2Jhost slots=1\n")
    code, out, _ = cli(capsys, "diff", "1", "2", "--runs-dir", str(runs))
    assert code == 0 and "\x1b" not in out and "evil\\x1b[2Jhost" in out


def test_a_sweep_or_an_unknown_run_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    make_run(runs, "60", tasks=(0, 1))
    make_run(runs, "41", metrics=[])
    code, _, err = cli(capsys, "diff", "60", "41", "--runs-dir", str(runs))
    assert code == 2 and "is a sweep" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "diff", "41", "nope", "--runs-dir", str(runs))
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_API_KEY", "DB_PASSWORD_X", "WANDB_API"])
def test_secret_names_are_hidden_by_pattern_or_by_the_recipes_secrets(name: str) -> None:
    from clusterkit.diagnose.run_diff import _compare

    rows = _compare({f"env.{name}": "a"}, {f"env.{name}": "b"}, {"WANDB_API"})
    assert [(d.a, d.b) for d in rows] == [("(hidden)", "(hidden)")]

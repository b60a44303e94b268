"""Every reporting command's ``--json`` has the shape docs/json.md documents (same keys, at every
level), prints nothing else on stdout, and keeps its exit code. The examples in the page are the
contract: a key added, renamed or dropped on either side fails here.

Runs on the local executor (one tiny training, one two-point sweep of a script, a preflight and a
one-scale bench); the same commands against SLURM print the same shapes (the record and status types
are shared by every adapter)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")
# Keys whose values are free-form mappings (labels, file names, a sweep point's keys, a result file, SSH
# settings, a report's problems by file name, a diff's groups that have differences).
FREE_FORM = {"summary", "files", "point", "result", "login", "problems", "groups"}


def documented() -> dict[str, list[Any]]:
    """docs/json.md's examples by section title (the command line in backquotes)."""
    sections = re.split(r"^## ", (REPO / "docs" / "json.md").read_text(), flags=re.M)[1:]
    return {
        re.search(r"`([^`]+)`", section).group(1): [
            json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)
        ]
        for section in sections
    }


DOCS = documented()


def differences(real: Any, doc: Any, where: str = "$") -> list[str]:
    """Where ``real`` and ``doc`` differ in shape: keys of mappings, kinds of values, list items."""
    if real is None or doc is None:
        return []
    if isinstance(doc, dict):
        if not isinstance(real, dict):
            return [f"{where}: expected an object, got {type(real).__name__}"]
        if where.rsplit(".", 1)[-1] in FREE_FORM:
            return []
        found = (
            [f"{where}: keys {sorted(set(real) ^ set(doc))} are in only one of output and docs"]
            if set(real) != set(doc)
            else []
        )
        return found + [d for key in set(real) & set(doc) for d in differences(real[key], doc[key], f"{where}.{key}")]
    if isinstance(doc, list):
        if not isinstance(real, list):
            return [f"{where}: expected a list, got {type(real).__name__}"]
        return differences(real[0], doc[0], f"{where}[0]") if real and doc else []
    numbers = (int, float)
    same = isinstance(real, numbers) and isinstance(doc, numbers) or type(real) is type(doc)
    return [] if same else [f"{where}: {type(real).__name__} where the docs show {type(doc).__name__}"]


def as_documented(done, title: str, example: int = 0) -> Any:
    """The command's stdout as one JSON document, shaped as the docs' example says."""
    assert title in DOCS, f"docs/json.md has no section for `{title}`"
    output = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    assert differences(output, DOCS[title][example]) == [], (title, output)
    return output


def test_the_shape_check_catches_a_renamed_key_and_a_wrong_kind() -> None:
    doc = {"run": {"job_id": "1", "nodes": 2}, "status": None}
    assert differences({"run": {"job_id": "1", "nodes": 2}, "status": {"state": "X"}}, doc) == []
    assert differences({"run": {"jobid": "1", "nodes": 2}, "status": None}, doc)
    assert differences({"run": {"job_id": 1, "nodes": 2}, "status": None}, doc)


def test_validate_and_render_and_plan(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("nodes: 2", "nodes: 0"))
    done = run_cli("validate", "--json", str(TINY), str(bad), cwd=tmp_path)
    assert done.returncode == 2
    output = as_documented(done, "clusterkit validate --json RECIPE...")
    assert [(r["ok"], r["path"]) for r in output["recipes"]] == [(True, str(TINY)), (False, str(bad))]
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "nodes: 0" in text)
    assert output["recipes"][1]["errors"] == [
        {
            "file": str(bad),
            "line": line,
            "key": "resources.nodes",
            "message": output["recipes"][1]["errors"][0]["message"],
        }
    ]
    assert (output["valid"], output["total"]) == (1, 2) and done.stderr == ""

    done = run_cli("render", "--json", str(TINY), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    output = as_documented(done, "clusterkit render --json RECIPE")
    written = sorted(
        str(p.relative_to(tmp_path / "out"))
        for p in (tmp_path / "out").rglob("*")
        if p.is_file() and p.name != ".clusterkit-render"
    )
    assert output["files"] == written and output["output_dir"] == str(tmp_path / "out")

    done = run_cli("plan", "--json", str(REPO / "recipes" / "ddp-1node-8gpu.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    as_documented(done, "clusterkit plan --json RECIPE")


def test_a_run_from_submit_to_export(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    dry = run_cli(
        "submit", str(TINY), "--executor", "local", "--dry-run", "--json", "--set", f"runs_dir={runs}", cwd=tmp_path
    )
    request = as_documented(dry, "clusterkit submit --dry-run --json RECIPE")
    plain = run_cli("submit", str(TINY), "--executor", "local", "--dry-run", "--set", f"runs_dir={runs}", cwd=tmp_path)
    assert request["files"][request["script"]] == plain.stdout  # the same script, in either form

    done = run_cli(
        "submit", str(TINY), "--executor", "local", "--follow", "--json", "--set", f"runs_dir={runs}", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    submitted = as_documented(done, "clusterkit submit --json RECIPE")
    assert submitted["status"]["state"] == "COMPLETED" and submitted["run"]["cluster"] == "dev"
    job = submitted["run"]["job_id"]

    status = as_documented(run_cli("status", "--json", job, "--runs-dir", str(runs)), "clusterkit status --json JOB")
    assert status == submitted["status"]
    listed = as_documented(run_cli("status", "--json", "--runs-dir", str(runs)), "clusterkit status --json")
    assert [(entry["job_id"], entry["state"]) for entry in listed] == [(job, "COMPLETED")]
    listed = as_documented(run_cli("ls", "--json", "--runs-dir", str(runs)), "clusterkit ls --json")
    assert listed == [{"run": submitted["run"], "status": submitted["status"]}]
    plotted = as_documented(
        run_cli("plot", "--json", job, "--runs-dir", str(runs), "-o", str(tmp_path / "c.png")),
        "clusterkit plot --json RUN...",
    )
    assert plotted["outputs"] == [str(tmp_path / "c.png")] and plotted["runs"][0]["series"]["loss"]["steps"][-1] == 30
    reported = as_documented(run_cli("report", "--json", job, "--runs-dir", str(runs)), "clusterkit report --json RUN")
    assert reported["source"] == "run files" and reported["figures"]["mfu"]["why"] == "a CPU run: no GPU peak"
    shares = {share["bucket"]: share["seconds"] for share in reported["shares"]}
    assert shares["training"] > 0 and shares["checkpointing"] > 0, "the runner timed its saves (every 15 of 30 steps)"
    diffed = as_documented(
        run_cli("diff", "--json", job, submitted["run"]["run_dir"], "--runs-dir", str(runs)),
        "clusterkit diff --json RUN_A RUN_B",
    )
    assert diffed["groups"] == {}
    cancelled = as_documented(run_cli("cancel", "--json", job, "--runs-dir", str(runs)), "clusterkit cancel --json JOB")
    assert cancelled == {"job_id": job, "cancelled": False, "status": submitted["status"]}
    exported = run_cli("export", "--json", submitted["run"]["run_dir"], "-o", str(tmp_path / "model"))
    assert exported.returncode == 0, exported.stderr
    assert as_documented(exported, "clusterkit export --json RUN_DIR")["output_dir"] == str(tmp_path / "model")
    assert (tmp_path / "model" / "config.json").is_file()


def test_a_sweep_and_its_results_table(tmp_path: Path) -> None:
    recipe = tmp_path / "arr.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "arr",
                "cluster": "dev",
                "runs_dir": str(tmp_path / "runs"),
                "launcher": "python",
                "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
                "task": {"script": SCRIPT},
                "sweep": {"grid": {"env.POINT": ["a", "b"]}},
            }
        )
    )
    done = run_cli("sweep", str(recipe), "--executor", "local", "--follow", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    submitted = as_documented(done, "clusterkit submit --json RECIPE")
    assert submitted["run"]["tasks"] == [0, 1] and submitted["status"]["state"] == "COMPLETED"
    status = run_cli("status", "--json", submitted["run"]["job_id"], "--runs-dir", str(tmp_path / "runs"))
    table = as_documented(status, "clusterkit status --json JOB", example=1)
    assert [(t["index"], t["point"], t["state"]) for t in table["tasks"]] == [
        (0, {"env.POINT": "a"}, "COMPLETED"),
        (1, {"env.POINT": "b"}, "COMPLETED"),
    ]


def test_doctor_preflight_and_bench(tmp_path: Path) -> None:
    as_documented(run_cli("doctor", "--json", cwd=tmp_path), "clusterkit doctor --json")
    runs = f"runs_dir={tmp_path / 'runs'}"
    done = run_cli(
        "preflight",
        str(TINY),
        "--executor",
        "local",
        "--json",
        "--set",
        runs,
        "--set",
        "preflight.slow_fraction=0.01",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    output = as_documented(done, "clusterkit preflight --json RECIPE")
    assert output["status"]["state"] == "COMPLETED" and output["result"]["world_size"] == 4
    done = run_cli(
        "bench",
        str(TINY),
        "--nodes",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--executor",
        "local",
        "--json",
        "--set",
        runs,
        "-o",
        str(tmp_path / "bench"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    output = as_documented(done, "clusterkit bench --json RECIPE --nodes 1,2")
    assert output["outputs"][0] == str(tmp_path / "bench" / "bench.json")
    assert json.loads((tmp_path / "bench" / "bench.json").read_text())["scales"] == output["scales"]
    assert "submitted 1 scales" in done.stderr  # progress on stderr, stdout the JSON alone


@pytest.mark.parametrize("title", sorted(DOCS))
def test_every_documented_example_is_valid_json_with_a_command(title: str) -> None:
    assert DOCS[title], f"section `{title}` has no JSON example"
    assert title.startswith("clusterkit ") and "--json" in title

"""profile: (spec.profiling) as settings: every refusal is one line with the recipe's file and line,
and kind nsys's wrapper in the launch plan. Stand-in: no GPU here, so nsys itself never runs; its
part is checked as the plan's argv."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from clusterkit import RecipeError, load_recipe, render_job
from conftest import REPO, run_cli

# A recipe with profile: on line 17 (kind 18, steps 19, ranks 20), on the CPU dev cluster: 2 x 2 ranks.
RECIPE = """\
    name: prof
    cluster: {cluster}
    launcher: {launcher}
    resources:
      nodes: 2
      gpus_per_node: 2
      time: "00:10:00"
    parallelism:
      micro_batch_size: 2
      gradient_accumulation_steps: 1
    task:
      trainer:
        model:
          config: {{model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_positions: 64, vocab_size: 512}}
        dataset: {{type: synthetic, seq_len: 64, num_samples: 256}}
        args: {{max_steps: 20}}
    profile:
      kind: {kind}
      steps: {steps}
      ranks: {ranks}
"""


FROM_1 = "steps count from 1 (the Trainer's global_step after the first optimizer step)"
STEPS_HINT = "must be an optimizer step or an inclusive range of them, e.g. 10 or 10-15"


def _recipe(tmp_path: Path, *, cluster="dev", launcher="torchrun", kind="torch", steps="2-4", ranks="[0]") -> Path:
    path = tmp_path / "recipe.yaml"
    text = RECIPE.format(cluster=cluster, launcher=launcher, kind=kind, steps=steps, ranks=ranks)
    path.write_text(textwrap.dedent(text))
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    errors = [line for line in str(caught.value).splitlines() if ": warning" not in line]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"steps": "4-2"}, ":19: profile.steps: 4-2 is reversed: write 2-4"),
        ({"steps": 0}, f":19: profile.steps: 0: {FROM_1}"),
        ({"steps": "0-3"}, f":19: profile.steps: 0-3: {FROM_1}"),
        ({"steps": -2}, f":19: profile.steps: -2: {FROM_1}"),
        ({"steps": '"-3"'}, f":19: profile.steps: {STEPS_HINT}"),
        ({"steps": '"2-"'}, f":19: profile.steps: {STEPS_HINT}"),
        ({"steps": '"2-4\\n"'}, f":19: profile.steps: {STEPS_HINT}"),
        (
            {"steps": "15-21"},
            ":19: profile.steps: step 21 is past task.trainer.args.max_steps (20): training ends before it",
        ),
        ({"ranks": "[0, 4]"}, ":20: profile.ranks[1]: rank 4 is not in the job: its ranks are 0-3"),
        ({"ranks": "[]"}, ":20: profile.ranks: Expected `array` of length >= 1"),
        ({"ranks": "[-1]"}, ":20: profile.ranks[0]: Expected `int` >= 0"),
        ({"kind": "perf"}, ":18: profile.kind: Invalid enum value 'perf'; valid: torch, nsys"),
        ({"kind": "nsys"}, ":18: profile.kind: nsys profiles GPU work and cluster 'dev' has no GPUs: use kind: torch"),
        (
            {"kind": "nsys", "cluster": "infiniband-h100", "launcher": "deepspeed"},
            ":18: profile.kind: nsys must start each rank, which clusterkit does under launcher torchrun, python, "
            "not deepspeed: change the launcher or use kind: torch",
        ),
    ],
)
def test_each_refusal_is_one_line_at_its_key(tmp_path: Path, settings: dict, expected: str) -> None:
    path = _recipe(tmp_path, **settings)
    assert _refusal(path) == f"{path}{expected}"


def test_a_script_task_is_refused_with_how_to_profile_it(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    text = path.read_text()
    trainer = text[text.index("  trainer:") : text.index("profile:")]
    path.write_text(text.replace(trainer, "  script: train.py\n"))
    assert _refusal(path) == (
        f"{path}:13: profile: the built-in runner (task.trainer) marks the steps to profile; a script profiles "
        "itself (torch.profiler or torch.cuda.profiler in its loop): leave profile out"
    )


def test_preflight_only_has_no_steps_to_profile(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    path.write_text(path.read_text() + "preflight: {only: true}\n")
    assert _refusal(path) == (
        f"{path}:17: profile: preflight.only runs the benchmark and no training: there are no steps to profile"
    )


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    path.write_text(path.read_text() + "  every: 2\n")
    assert _refusal(path).startswith(f"{path}:21: profile.every: unknown key 'every'")


def test_the_cli_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    path = _recipe(tmp_path, steps="4-2")
    done = run_cli("render", str(path), "-o", str(tmp_path / "out"), env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"{path}:19: profile.steps: 4-2 is reversed: write 2-4"
    assert not (tmp_path / "out").exists()


def test_default_ranks_and_a_single_step(tmp_path: Path) -> None:
    path = _recipe(tmp_path, steps=7)
    path.write_text(path.read_text().replace("  ranks: [0]\n", ""))
    spec = load_recipe(path).recipe.profile
    assert spec is not None and spec.ranks == [0] and spec.first_last == (7, 7)


def _plan(path: Path) -> dict:
    return json.loads(render_job(load_recipe(path)).files["plan.json"])


NSYS = [
    "nsys",
    "profile",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--trace=cuda,nvtx,osrt",
    "--force-overwrite=true",
    "-o",
    "{run_dir}/profile/nsys-rank%q{RANK}",
]


def test_nsys_wraps_each_rank_under_torchrun(tmp_path: Path) -> None:
    """Stand-in: no GPU here. torchrun starts every rank as nsys's command (--no-python), nsys names
    each report by the rank's RANK; the job fills in {run_dir} and nothing else (%q{RANK} is nsys's)."""
    path = _recipe(tmp_path, cluster="infiniband-h100", kind="nsys")
    text = path.read_text()
    path.write_text(text + "preflight: true\n")
    plan = _plan(path)
    argv = plan["launch"]["argv"]
    at = argv.index("--no-python")
    assert argv[at + 1 : at + 1 + len(NSYS)] == NSYS
    assert argv[at + 1 + len(NSYS) :] == ["python3", "-m", "clusterkit.runtime.runner", "{run_dir}/job.json"]
    assert at + len(NSYS) in plan["launch"]["expand"]  # the -o value holds {run_dir}
    assert "nsys" not in plan["preflight"]["argv"]  # the benchmark is not profiled


def test_nsys_prefixes_each_srun_task_under_launcher_python(tmp_path: Path) -> None:
    """Stand-in: no GPU here. With launcher python, srun starts each rank: the argv starts with nsys."""
    plan = _plan(_recipe(tmp_path, cluster="infiniband-h100", launcher="python", kind="nsys"))
    argv = plan["launch"]["argv"]
    assert argv[: len(NSYS)] == NSYS
    assert argv[len(NSYS) :] == ["python3", "-m", "clusterkit.runtime.runner", "{run_dir}/job.json"]


def test_kind_torch_leaves_the_launch_as_it_was(tmp_path: Path) -> None:
    with_profile = _plan(_recipe(tmp_path))["launch"]["argv"]
    assert "nsys" not in with_profile and "--no-python" not in with_profile
    assert with_profile[-3:] == ["-m", "clusterkit.runtime.runner", "{run_dir}/job.json"]


def test_docs_example_validates() -> None:
    """The recipe block of docs/guides/running-jobs.md's profiling section loads as written."""
    page = (REPO / "docs" / "guides" / "running-jobs.md").read_text()
    section = page[page.index("## Profiling a few steps") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    example = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
    profile = yaml.safe_load(block.group(1))["profile"]
    loaded = load_recipe(example, [f"profile={json.dumps(profile)}"])
    assert loaded.recipe.profile is not None and loaded.recipe.profile.kind == "torch"

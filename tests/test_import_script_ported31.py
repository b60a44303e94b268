"""clusterkit import on the issue-31 originals (tests/data/ported-31, PORTS_31.md): what the import
got silently wrong there. Each test reproduces one finding, on the real original and on a small
script of the same form; the promise is that a line dropped or changed is listed, and the recipe
validates."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from clusterkit.cli.scaffold import checked
from clusterkit.load.import_script import Imported, import_script
from clusterkit.load.import_yaml import recipe_yaml
from clusterkit.load.script_text import parse_script, read_script

REPO = Path(__file__).resolve().parent.parent
PORTED = REPO / "tests" / "data" / "ported-31"
# An original that has been ported moves to the import originals (with its .expected file).
PORTED_NOW = REPO / "tests" / "data" / "import" / "originals"
HEADER = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4\n"


def _imported(text: str) -> Imported:
    return import_script(parse_script(text, "job.sh"))


def _path(name: str) -> Path:
    waiting = PORTED / f"{name}.sbatch"
    return waiting if waiting.exists() else PORTED_NOW / f"{name}.sbatch"


def _original(name: str) -> Imported:
    return import_script(read_script(_path(name)))


def _listed(imported: Imported, why: str) -> list[tuple[int, str]]:
    return [(u.line, u.text) for u in imported.unmapped if why in u.why]


def _argv_words(imported: Imported) -> list[str]:
    recipe = imported.recipe
    python = recipe.get("python", [])
    return [
        *([python] if isinstance(python, str) else python),
        recipe["task"].get("script") or recipe["task"]["program"],
        *recipe["task"].get("args", []),
    ]


# Every original PORTS_31.md analyses ("### N. `name` - ..."), waiting in ported-31 or ported already.
ISSUE_31 = sorted(
    line.split("`")[1] for line in (REPO / "PORTS_31.md").read_text().splitlines() if line.startswith("### ")
)


@pytest.mark.parametrize("name", ISSUE_31)
def test_each_issue_31_original_imports_to_a_recipe_that_validates(name: str, tmp_path: Path) -> None:
    """No exit 2 without a report: every original gives a recipe (validated against the derived
    profile, as `clusterkit import SCRIPT` does) and no shell expansion in an argv field."""
    from clusterkit.load.import_yaml import derived_profile

    imported = _original(name)
    checked(recipe_yaml(imported, name, "cluster.yaml"), None, derived_profile(imported), tmp_path)
    for word in _argv_words(imported):
        assert "$" not in word and "\x00" not in word, (name, word)


# 1. sbatch abbreviations


def test_an_abbreviated_sbatch_option_reads_as_the_full_option(tmp_path: Path) -> None:
    """alignment-handbook's launch.slurm: `#SBATCH --err=...` is sbatch's --error; the import
    exited 2 with no recipe and no report."""
    imported = _original("handbook-launch")
    assert "err" not in imported.recipe["resources"].get("extra_sbatch", {})
    assert any(u.text.startswith("--error=/fsx/h4/logs/") for u in imported.unmapped)
    result = subprocess.run(
        [shutil.which("python") or "python", "-m", "clusterkit.cli.main", "import", "--json",
         str(_path("handbook-launch"))],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["not_mapped"]


def test_sbatch_prefixes_expand_and_an_ambiguous_one_is_listed() -> None:
    imported = _imported(
        "#SBATCH --nodes=3 --part=big --mail-t=END --wait-all=1 --nod=2 --mem-p=1G\nsrun python a.py\n"
    )
    resources = imported.recipe["resources"]
    assert resources["nodes"] == 3 and resources["partition"] == "big" and resources["wait_all_nodes"]
    assert resources["extra_sbatch"] == {"mail-type": "END"}
    assert [t for _, t in _listed(imported, "ambiguous")] == ["--nod=2", "--mem-p=1G"]  # sbatch refuses both


# 2. a container wrapper and the variables kept values read


def test_a_singularity_run_wrapper_is_listed_and_its_variables_kept() -> None:
    """LUMI's run_ddp_srun_4.sh: `srun --cpu-bind=v,mask_cpu=$CPU_BIND_MASKS singularity run $SIF
    bash -c "... python x.py"`: the wrapper was dropped without a word, SIF and CPU_BIND_MASKS too."""
    imported = _original("lumi-ddp-singularity")
    listed = [u for u in imported.unmapped if "container" in u.why]
    assert listed and listed[0].line == 39 and "lumi-multitorch-full" in listed[0].text
    assert "container" in listed[0].nearest
    assert imported.recipe["srun"]["cpu_bind"].startswith("v,mask_cpu=0x00fe000000000000,")
    setup = imported.recipe["setup"]
    assert "MIOPEN_DIR=$(mktemp -d)" in setup  # the setup lines after it read it
    assert setup.index("MIOPEN_DIR=$(mktemp -d)") < setup.index("export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_DIR/cache")
    assert not _listed(imported, "computed value") or all(line != 18 for line, _ in _listed(imported, "computed"))


def test_a_plain_variable_a_kept_line_reads_is_kept_before_it() -> None:
    imported = _imported(HEADER + "OUT=/scratch/x\nUNUSED=1\nmkdir -p $OUT\nsrun python a.py\necho done > ${OUT}/f\n")
    assert imported.recipe["setup"] == ["OUT=/scratch/x"]
    assert imported.recipe["hooks"] == {"pre_launch": ["mkdir -p $OUT"], "post_run": ["echo done > ${OUT}/f"]}


def test_a_run_time_srun_option_value_is_listed_not_kept() -> None:
    imported = _imported(HEADER + "srun --cpu-bind=mask_cpu:$MASKS --mpi=$MPI python a.py\n")
    assert "cpu_bind" not in imported.recipe["srun"] and "mpi" not in imported.recipe["srun"]
    assert len(_listed(imported, "run-time value in an srun option")) == 2


def test_a_container_program_kept_as_the_command_is_listed() -> None:
    imported = _original("mlperf-hpc-cosmoflow-shifter")
    assert imported.recipe["task"]["script"] == "shifter"
    assert any("container" in u.why and "container" in u.nearest for u in imported.unmapped)


# 3. which srun is the launch


def test_the_launch_is_the_real_work_not_a_utility_step() -> None:
    """aws-nccl-tests-container: `mpirun -N 1 bash -c 'echo $(hostname)...'` then `srun
    "${ARGS[@]}" ... all_reduce_perf`: the test is the launch, not a post_run hook."""
    imported = _original("aws-nccl-tests-container")
    assert imported.recipe["launcher"] == "srun"  # 8 tasks per node: a program per rank
    assert imported.recipe["task"]["program"] == "/opt/nccl-tests/build/all_reduce_perf"
    assert "post_run" not in imported.recipe.get("hooks", {})
    assert any("ARGS" in t for _, t in _listed(imported, "array"))


def test_only_utility_steps_outside_loops_give_no_launch() -> None:
    """MLPerf SSD run.sub: its training srun is inside a loop; `nvidia-smi topo -m` is no launch."""
    imported = _original("mlperf-ssd-run-sub")
    assert imported.recipe["task"]["script"] != "nvidia-smi"
    assert _listed(imported, "no launch line")


def test_several_launches_of_real_work_are_listed() -> None:
    imported = _imported(HEADER + "srun hostname\nsrun python prep.py\nsrun torchrun --nnodes 2 train.py\n")
    assert imported.recipe["launcher"] == "torchrun" and imported.recipe["task"]["script"] == "train.py"
    assert [line for line, _ in _listed(imported, "another step that starts work")] == [5]


# 4. shell values never literal in argv


@pytest.mark.parametrize(
    "launch, kept, nearest",
    [
        ('srun python a.py -d "$@"', ["-d"], "submit"),
        ("srun python a.py --config configs/$ACC.yaml --x 1", ["--x", "1"], "task.args"),
        ("srun python a.py --rank $SLURM_PROCID", ["--rank", "{rank}"], None),
        ("srun bash -c 'a.out --rank $SLURM_PROCID'", [], "{rank}"),
        ("srun python a.py ${1:-x.yaml}", [], "submit"),
    ],
    ids=["dollar-at", "option-value", "rank-per-task", "rank-per-node", "positional"],
)
def test_a_shell_value_never_reaches_an_argv_field(launch: str, kept: list[str], nearest: str | None) -> None:
    imported = _imported(HEADER + launch + "\n")
    assert imported.recipe["task"].get("args", []) == kept
    listed = [u for u in imported.unmapped if "run-time value in an argument" in u.why]
    assert bool(listed) == (nearest is not None)
    if nearest:
        assert nearest in listed[0].nearest


def test_a_program_that_is_a_positional_argument_is_not_written_literally() -> None:
    """nccl-tests-ami: `ALL_REDUCE_BINARY=${1:-/usr/local/...}` then mpirun ... ${ALL_REDUCE_BINARY}."""
    imported = _original("aws-nccl-tests-ami")
    assert "$" not in imported.recipe["task"]["script"]
    assert any("program" in u.why and "submit" in u.nearest for u in imported.unmapped)


# 5. per-rank programs


def test_a_per_rank_program_under_srun_is_a_program_per_rank() -> None:
    """llm.c: `srun -l -u bash -c "train_gpt2cu ... -pn \\$SLURM_NTASKS -pr \\$SLURM_PROCID"` with 8
    tasks per node: task.program per rank, no interpreter, SLURM_PROCID as {rank}; -pn's value is a
    run-time one, so -pn goes with it (kept alone, it would take -pr as its value)."""
    imported = _original("llmc-multinode-fs")
    assert imported.recipe["launcher"] == "srun" and "python" not in imported.recipe
    task = imported.recipe["task"]
    assert task["program"] == "/home/ubuntu/llm.c/train_gpt2cu" and "-pn" not in task["args"]
    assert task["args"][task["args"].index("-pr") + 1] == "{rank}"
    assert not _listed(imported, "once per node")
    assert ("-pn $SLURM_NTASKS") in [text for _, text in _listed(imported, "left out")]


def test_a_non_python_program_under_mpirun_gets_no_interpreter() -> None:
    imported = _imported(HEADER + "mpirun -np 8 -x A=1 /opt/bin/all_reduce_perf -b 8\n")
    assert imported.recipe["launcher"] == "command" and "python" not in imported.recipe
    assert imported.recipe["task"] == {"script": "/opt/bin/all_reduce_perf", "args": ["-b", "8"]}
    assert _listed(imported, "mpirun")
    python = _imported(HEADER + "mpirun -np 8 train.py\n").recipe
    assert python["launcher"] == "mpirun"


# 6. a front end in the batch shell


def test_a_python_front_end_in_the_batch_shell_runs_there_once_not_multiplied() -> None:
    """GPT-NeoX: `python3 deepy.py train.py cfg.yml` in the batch shell starts the ranks itself: a
    front end (launcher command in the batch shell), exactly as the script runs it."""
    imported = _original("gpt-neox-readme-slurm")
    assert (imported.recipe["launcher"], imported.recipe["process_model"]) == ("command", "batch_launcher")
    assert imported.recipe["task"]["program"] == "python3"
    assert imported.recipe["task"]["args"][:2] == ["deepy.py", "train.py"]


# 7. multi-line constructs


def test_a_bash_array_over_several_lines_stays_whole() -> None:
    imported = _imported(HEADER + "declare -a ARGS=(\n  --container-image $IMAGE\n  # a comment\n)\nsrun python a.py\n")
    assert "hooks" not in imported.recipe and "setup" not in imported.recipe
    assert [line for line, _ in _listed(imported, "several lines")] == [4]
    original = _original("aws-nccl-tests-container")
    hooks = [*original.recipe.get("setup", []), *original.recipe.get("hooks", {}).get("pre_launch", [])]
    assert not any(line.strip() in ("declare -a ARGS=(", ")") for line in hooks)


# hostile forms of the same constructs


def test_an_array_that_never_closes_is_listed_in_bounded_time() -> None:
    started = time.monotonic()
    imported = _imported(HEADER + "ARR=(\n" + "  x\n" * 200_000 + "srun python a.py\n")
    assert time.monotonic() - started < 30
    assert imported.unmapped and imported.recipe["task"]["script"] == "a.py"


def test_variables_reading_each_other_in_a_cycle_are_kept_once() -> None:
    imported = _imported(HEADER + "A=$B\nB=$A\nmkdir -p $A\nsrun python a.py\n")
    assert imported.recipe["setup"] == ["A=$B", "B=$A"]


@pytest.mark.parametrize(
    "script",
    [
        ': "${BIN:=$(touch canary)}"\nsrun $BIN -x\n',
        "srun ${1:-`touch canary`} -x\n",
        "srun ${1:-/opt/a\x1b]0;t\x07} -x\n",
    ],
    ids=["computed-default", "backtick-default", "control-characters"],
)
def test_a_program_default_that_is_not_literal_is_never_written(script: str, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text(HEADER + "#SBATCH --ntasks-per-node=1\n" + script)
    result = subprocess.run(
        [shutil.which("python") or "python", "-m", "clusterkit.cli.main", "import", "--json", "job.sh"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "canary").exists()
    assert "\x1b" not in result.stdout + result.stderr
    assert any("the program" in item["why"] for item in json.loads(result.stdout)["not_mapped"])


def test_a_script_of_utility_steps_only_says_why_it_has_no_launch() -> None:
    imported = _imported(HEADER + "srun hostname\nsrun /usr/bin/nvidia-smi -L\nfor i in 1; do srun python a.py; done\n")
    assert imported.recipe["hooks"]["pre_launch"] == ["srun hostname", "srun /usr/bin/nvidia-smi -L"]
    assert any("utilit" in u.why for u in imported.unmapped if "no launch line" in u.why)


def test_an_srun_with_options_and_no_command_is_no_launch_and_no_traceback() -> None:
    """`srun --exclusive` alone on a line raised an IndexError (a traceback for user input)."""
    imported = _imported(HEADER + "srun --exclusive\nsrun python a.py\n")
    assert imported.recipe["task"] == {"script": "a.py"}


def test_a_shell_as_the_program_is_a_program_not_a_script_whose_folder_is_copied() -> None:
    """`srun /bin/bash run.sh`: task.script would snapshot /bin (the script's folder) into the run
    directory; a shell is a system program, run as it is."""
    for launch in ("srun /bin/bash run.sh --x 1\n", "srun --ntasks-per-node=1 bash run.sh\n"):
        imported = _imported(HEADER + launch)
        assert "script" not in imported.recipe["task"], imported.recipe
        assert imported.recipe["task"]["program"] in ("/bin/bash", "bash")

"""clusterkit import (a batch script read as words, never run) and clusterkit new: round trips of
rendered jobs, hostile scripts, ported excerpts, and new recipes that validate and render clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from clusterkit import api
from clusterkit.cli.main import main
from clusterkit.cli.scaffold import checked
from clusterkit.errors import UsageError
from clusterkit.load.import_script import import_script
from clusterkit.load.import_yaml import recipe_yaml
from clusterkit.load.script_compare import differences, rendered_parts
from clusterkit.load.script_text import read_script
from conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "import"
ORIGINALS = DATA / "originals"
# Every shipped recipe: its rendered job imports back to a recipe that renders the same job. Not yet
# those whose layout (ZeRO, FSDP) is only in the rendered accelerate_config.yaml (or the user's config it
# names: handbook-launch's DeepSpeed ZeRO-3), which import does not read.
LAYOUT_IN_ACCELERATE_CONFIG = {
    "recipes/accelerate-fsdp.yaml",
    "recipes/accelerate-zero3-script.yaml",
    "recipes/ported/handbook-launch.yaml",
}
ROUND_TRIP = sorted(
    str(p.relative_to(REPO))
    for p in [*REPO.glob("recipes/*.yaml"), *REPO.glob("recipes/ported/*.yaml")]
    if str(p.relative_to(REPO)) not in LAYOUT_IN_ACCELERATE_CONFIG
)


def _render(recipe: str | Path, folder: Path) -> Path:
    loaded = api.load_recipe(recipe)
    folder.mkdir(parents=True)
    for name, text in api.render_job(loaded).files.items():
        if "/" not in name:
            (folder / name).write_text(text)
    return folder / "job.sbatch"


@pytest.mark.parametrize("recipe", ROUND_TRIP)
def test_the_import_of_a_rendered_job_renders_the_same_job(recipe: str, tmp_path: Path) -> None:
    loaded = api.load_recipe(REPO / recipe)
    job = _render(REPO / recipe, tmp_path / "first")
    imported = import_script(read_script(job), loaded.profile)
    recipe_text = recipe_yaml(imported, str(job), str(loaded.profile_path.resolve()))
    home = (REPO / recipe).parent
    for own_file in home.glob("*.json"):  # the recipe's relative files, beside the import too
        shutil.copy(own_file, tmp_path)
    files, _ = checked(recipe_text, None, folder=tmp_path)
    plan = json.loads(files["plan.json"].replace(str(tmp_path), str(home.resolve())))
    before = rendered_parts(job.read_text(), json.loads((job.parent / "plan.json").read_text()))
    assert differences(before, rendered_parts(files["job.sbatch"], plan)) == []
    first_plan = json.loads((job.parent / "plan.json").read_text())
    first, second = first_plan["launch"], plan["launch"]
    assert (second["argv"], second["srun"]) == (first["argv"], first["srun"])
    assert plan["components"] == first_plan["components"]  # a heterogeneous job's: only plan.json says them


def _import(tmp_path: Path, text: str | bytes, *extra: str) -> tuple[int, str, str]:
    script = tmp_path / "job.sh"
    script.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = subprocess.run(
        [shutil.which("python") or "python", "-m", "clusterkit.cli.main", "import", str(script), *extra],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    return result.returncode, result.stdout, result.stderr


def test_nothing_in_a_script_is_ever_run(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    lines = [
        "#!/bin/bash", "#SBATCH --nodes=1", f"touch {canary}1", f"X=$(touch {canary}2)", f"Y=`touch {canary}3`",
        f"export Z=$(touch {canary}4)", f"if true; then touch {canary}5; fi", f"cat <<EOF\n$(touch {canary}6)\nEOF",
        f"f() {{ touch {canary}7; }}", f"srun bash -c 'touch {canary}8; python train.py --out $(touch {canary}9)'",
        f"source {canary}10", f"echo done > {canary}11",
    ]  # fmt: skip
    code, out, err = _import(tmp_path, "\n".join(lines) + "\n")
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("canary")] == []
    assert "not mapped" in err


@pytest.mark.parametrize(
    "text, expected",
    [
        (b"#!/bin/bash\nsrun python a.py\x00\n", "job.sh:2: a NUL byte"),
        (b"#!/bin/bash\nsrun python \xff.py\n", "job.sh:2: not UTF-8"),
    ],
)
def test_a_file_that_is_no_text_script_is_one_line_exit_2(tmp_path: Path, text: bytes, expected: str) -> None:
    code, _, err = _import(tmp_path, text)
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1


def test_a_fifo_or_a_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name in ("fifo", "folder"):
        assert main(["import", str(tmp_path / name)]) == 2


@pytest.mark.parametrize(
    "text, why",
    [
        ("#SBATCH -N 1\nsrun python 'a.py\n", "unbalanced"),
        ("#SBATCH -N 1\ncat <<'X'\nsrun python evil.py\nX\nsrun python a.py\n", "here-document"),
        ("#SBATCH -N 1\nfor i in 1 2; do\n  srun python b.py\ndone\nsrun python a.py\n", "loop"),
        ("#SBATCH -N 1\nexport A=`hostname`\nsrun python a.py\n", "computed"),
        ("#SBATCH -N 1\nexport A=" + "x" * 1_000_000 + "\nsrun python a.py\n", "longer than"),
        ("#SBATCH -N 1\necho 'open\n" + "x\n" * 500_000, "unbalanced"),
        ("#SBATCH -N 1\n" + "echo $(\n" * 200_000, "unbalanced"),
        ("#SBATCH -N 1\n" + "abc\\\n" * 800_000 + "\nsrun python a.py\n", "longer than"),
    ],
    ids=[
        "quote",
        "heredoc",
        "loop",
        "backticks",
        "1MB-line",
        "quote-then-500k-lines",
        "200k-open-subshells",
        "800k-continued-lines",
    ],  # fmt: skip
)
def test_hostile_lines_are_listed_inert_in_bounded_time(tmp_path: Path, text: str, why: str) -> None:
    started = time.monotonic()
    code, out, err = _import(tmp_path, text, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert any(why in item["why"] for item in report["not_mapped"]), report["not_mapped"]
    assert time.monotonic() - started < 30


def test_the_json_report_is_shaped_as_documented(tmp_path: Path) -> None:
    from test_json_shapes import as_documented

    (tmp_path / "job.sbatch").write_text("#SBATCH --nodes=2\nX=$(hostname)\nsrun python a.py\n")
    done = run_cli("import", "--json", str(tmp_path / "job.sbatch"), "-o", str(tmp_path / "job.yaml"), cwd=tmp_path)
    assert as_documented(done, "clusterkit import --json SCRIPT")["not_mapped"][0]["line"] == 2


def test_crlf_line_ends_read_as_lines(tmp_path: Path) -> None:
    code, out, err = _import(
        tmp_path, "#!/bin/bash\r\n#SBATCH --nodes=2\r\nexport A=1\r\nsrun python a.py --x 1\r\n", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["not_mapped"] == []


def test_an_existing_output_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "out.yaml").write_text("mine")
    code, _, err = _import(tmp_path, "#SBATCH -N 1\nsrun python a.py\n", "-o", str(tmp_path / "out.yaml"))
    assert code == 2 and "exists already" in err and (tmp_path / "out.yaml").read_text() == "mine"


def _against_hand_port(script: Path, hand: Path, folder: Path) -> list[str]:
    """The differences between the render of ``script``'s import (against the hand port's cluster
    profile) and the hand port's render; a UsageError where the import does not validate."""
    loaded = api.load_recipe(hand)
    job = _render(hand, folder / "hand")
    imported = import_script(read_script(script), loaded.profile)
    for own_file in hand.parent.glob("*.json"):  # the hand port's relative files, beside the import too
        shutil.copy(own_file, folder)
    files, _ = checked(recipe_yaml(imported, str(script), str(loaded.profile_path.resolve())), None, folder=folder)
    plan = files["plan.json"].replace(str(folder), str(hand.parent.resolve()))  # its copies of the port's files
    ours = rendered_parts(files["job.sbatch"], json.loads(plan))
    theirs = rendered_parts(job.read_text(), json.loads((job.parent / "plan.json").read_text()))
    return differences(theirs, ours)


@pytest.mark.parametrize("port", sorted(DATA.glob("*.sbatch")), ids=lambda p: p.stem)
def test_ported_excerpts_import_close_to_the_hand_port(port: Path, tmp_path: Path) -> None:
    hand = REPO / "recipes" / "ported" / f"{port.stem}.yaml"
    assert _against_hand_port(port, hand, tmp_path) == port.with_suffix(".differences").read_text().splitlines()


def _import_report(script: Path, hand: Path, folder: Path) -> list[str]:
    """What importing ``script`` gives, as the lines of its ``.expected`` file: the counts, whether
    the recipe validates (or the one line why not), what is not mapped, and the differences
    between its render and the hand port's."""
    imported = import_script(read_script(script), api.load_recipe(hand).profile)
    lines = [
        f"lines mapped to fields: {len(set(imported.mapped))}",
        f"lines kept as setup/hook lines: {len(set(imported.kept))}",
        f"lines not mapped: {len(imported.unmapped)}",
    ]
    lines += [f"not mapped {u.line}: {u.text[:100]!a} ({u.why})" for u in imported.unmapped]
    try:
        found = _against_hand_port(script, hand, folder)
    except UsageError as exc:
        return [*lines, f"recipe: does not validate: {str(exc).replace(str(folder), '<beside the recipe>')}"]
    # differences() names its first side "the script": here that is the hand port's render
    found = [line.replace("only in the script", "only in the hand port") for line in found]
    found = [line.replace(str(REPO), "<repo>") for line in found]  # a hand port's own file, resolved at load
    return [*lines, "recipe: validates", *(f"hand port -> import: {line}" for line in found)]


@pytest.mark.parametrize("original", sorted(ORIGINALS.glob("*.sbatch")), ids=lambda p: p.stem)
def test_the_real_originals_import_as_recorded(original: Path, tmp_path: Path) -> None:
    """Each public original behind recipes/ported/ (tests/data/import/originals/SOURCES.md), imported
    against its hand port's cluster profile: nothing run, no traceback, and the recorded result."""
    before = sorted(tmp_path.iterdir())
    report = _import_report(original, REPO / "recipes" / "ported" / f"{original.stem}.yaml", tmp_path / "import")
    assert report == original.with_suffix(".expected").read_text().splitlines()
    assert sorted(tmp_path.iterdir()) == [*before, tmp_path / "import"]


@pytest.mark.parametrize(
    "start", [["--script", "train.py"], ["--trainer", "gpt2"], ["--trainer", "llama", "--zero3", "--nodes", "2"]]
)
def test_new_recipes_validate_and_render_clean(start: list[str], tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    assert main(["new", *start, "-o", str(out)]) == 0
    assert main(["new", *start, "-o", str(out)]) == 2  # never overwritten
    job = _render(out, tmp_path / "render")
    subprocess.run(["bash", "-n", str(job)], check=True)
    subprocess.run(["shellcheck", "-S", "error", str(job)], check=True)


@pytest.mark.parametrize(
    "text, why",
    [
        ('#SBATCH -N 1\necho "two\nlines"\nsrun python a.py\n', "several lines"),
        ("#SBATCH -N 1\n#SBATCH --Weird=1\n#SBATCH -Z\nsrun python a.py\n", "no sbatch option name"),
        ("#SBATCH -N 1\nsrun --container-image=$IMG python a.py\n", "a run-time value"),
        ("#SBATCH -N 1\nsrun python $SCRIPT --x 1\n", "a run-time value"),
        ("#SBATCH -N 1\nsrun --gpu-bind=closest --nodelist=n1 --open-mode=append python a.py\n", "step sets it"),
    ],
    ids=["multi-line-command", "odd-flags", "srun-variable", "program-variable", "step-owned-srun-options"],
)
def test_what_a_field_cannot_hold_is_listed_and_the_rest_validates(tmp_path: Path, text: str, why: str) -> None:
    code, out, err = _import(tmp_path, text, "--json")
    assert code == 0, err
    assert any(why in item["why"] for item in json.loads(out)["not_mapped"]), out


def test_control_characters_reach_no_terminal(tmp_path: Path) -> None:
    code, out, err = _import(tmp_path, "#SBATCH -N 1\nX=$(printf '\x1b]0;owned\x07')\nsrun python a.py\n")
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["new", "--script=-rf.py"], "reads as an option"),
        (["new", "--script", "a\nb.py"], "a path on one line"),
        (["new", "--gpus", "0"], "--gpus 1 to 64"),
        (["import", "job.sh", "-o", "missing/x.yaml"], "no such folder"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path: Path, arguments: list[str], message: str) -> None:
    (tmp_path / "job.sh").write_text("#SBATCH -N 1\nsrun python a.py\n")
    done = run_cli(*arguments, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]


def _recipe(text: str) -> dict:
    from clusterkit.load.script_text import parse_script

    return import_script(parse_script(text, "job.sh")).recipe


HEADER = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4\n"


@pytest.mark.parametrize(
    "launch, expected",
    [
        (
            "srun deepspeed --num_gpus 4 --num_nodes 2 --include node1:0,1 --master_port 29600 train.py --ds c.json",
            {"launcher": "deepspeed", "master_port": 29600, "deepspeed": {"include": "node1:0,1"},
             "task": {"script": "train.py", "args": ["--ds", "c.json"]}},
        ),
        (
            "srun accelerate launch --config_file acc.yaml --mixed_precision bf16 --num_processes 8 -m pkg.train --lr 1",
            {"launcher": "accelerate", "accelerate": {"config": "acc.yaml"}, "precision": "bf16",
             "task": {"script": "pkg.train", "module": True, "args": ["--lr", "1"]}},
        ),
        (
            "mpirun -np 8 --bind-to core -x NCCL_DEBUG python3 -u hvd.py",
            {"launcher": "mpirun", "launcher_args": ["--bind-to", "core", "-x", "NCCL_DEBUG"],
             "python": "python3", "task": {"script": "hvd.py"}},  # -u: clusterkit's mpirun line writes it
        ),
        (
            "srun --ntasks-per-node=4 --mpi=pmix --label python -u train.py",
            {"launcher": "python", "srun": {"kill_on_bad_exit": False, "mpi": "pmix", "label": True},
             "python": ["python", "-u"], "task": {"script": "train.py"}},
        ),
        (
            "srun --container-image=nvcr.io/x:1 ./run.sh --epochs 3",
            {"launcher": "command", "srun": {"kill_on_bad_exit": False, "extra": {"container-image": "nvcr.io/x:1"}},
             "task": {"script": "./run.sh", "args": ["--epochs", "3"]}},
        ),
    ],
    ids=["deepspeed", "accelerate", "mpirun", "python-per-task", "command"],
)  # fmt: skip
def test_each_launcher_maps_to_its_fields(launch: str, expected: dict) -> None:
    recipe = _recipe(HEADER + launch + "\n")
    assert {key: recipe.get(key) for key in expected} == expected
    assert recipe["resources"]["nodes"] == 2 and recipe["resources"]["gpus_per_node"] == 4


def test_header_and_environment_forms_map_to_their_fields() -> None:
    recipe = _recipe(
        "#SBATCH -N 4 -t 2-00:00:00 -p big -A proj --qos=high --array=0-9%2 --signal=B:USR2@300 --no-requeue\n"
        "#SBATCH --gres=gpu:a100:8 --mem=0 --constraint=ib --exclusive --mail-user=me@x.org --comment=hi\n"
        "  #SBATCH --nodes=9\n"  # indented: a comment to sbatch
        "export A=1 B='two words'\nexport PATH=/opt/bin:$PATH\nexport LD_LIBRARY_PATH=${LD_LIBRARY_PATH}:/opt/lib\n"
        "unset C\nexport D=$HOME/x\nsrun torchrun --nproc-per-node=8 t.py\n"
    )
    assert recipe["resources"] == {
        "nodes": 4, "time": "2-00:00:00", "partition": "big", "account": "proj", "qos": "high", "array": "0-9%2",
        "mem": "0", "constraint": "ib", "exclusive": True, "gpus_per_node": 8,
        "extra_sbatch": {"mail-user": "me@x.org", "comment": "hi"},
    }  # fmt: skip
    assert recipe["preemption"] == {"signal": "USR2", "grace_s": 300, "requeue": False, "max_requeues": 0}
    assert recipe["env"] == {
        "A": "1", "B": "two words", "PATH": {"prepend": "/opt/bin"}, "LD_LIBRARY_PATH": {"append": "/opt/lib"},
        "C": None, "OMP_NUM_THREADS": None,
    }  # fmt: skip
    assert recipe["setup"] == ["export D=$HOME/x"]


@pytest.mark.parametrize(
    "cluster, launch, image, listed",
    [
        ("pyxis-h100", "srun --container-image=/img/mine.sqsh --container-mounts=/d:/d python a.py", "/img/mine.sqsh",
         "the profile's container settings"),
        ("apptainer-a100", "srun apptainer exec --nv -B /d:/d /img/mine.sif python a.py", "/img/mine.sif", None),
        ("dev", "srun apptainer exec --nv /img/mine.sif python a.py", None, "a container the recipe cannot name: the program would run outside it"),
        # Apptainer is Singularity renamed: either command maps to a profile of either name.
        ("singularity-a100", "srun singularity exec --nv -B /d:/d /img/mine.sif python a.py", "/img/mine.sif", None),
        ("singularity-a100", "srun apptainer exec --nv /img/mine.sif python a.py", "/img/mine.sif", None),
        ("docker-h100", "srun docker run --rm --gpus all -e RANK -v /d:/d --network host me/mine:1 python a.py",
         "me/mine:1", None),
        ("shifter-perlmutter", "srun shifter --image=docker:me/mine:1 --module=gpu python a.py", "docker:me/mine:1",
         None),
        ("dev", "srun docker run -it me/mine:1 python a.py", None, "a container the recipe cannot name: the program would run outside it"),
        ("enroot-h100", "srun enroot start -e NCCL_DEBUG /img/mine.sqsh python a.py", "/img/mine.sqsh", None),
        ("dev", "srun enroot start /img/mine.sqsh python a.py", None, "a container the recipe cannot name: the program would run outside it"),
        # a bash -c inside the container is still the container's (its runtime kept)
        ("enroot-h100", "srun enroot start /img/mine.sqsh bash -c 'cd /w && python a.py'", "/img/mine.sqsh", None),
        ("apptainer-a100", "srun apptainer exec --nv /img/mine.sif bash -c 'python a.py'", "/img/mine.sif", None),
    ],
    ids=[
        "pyxis", "apptainer", "no-container-profile", "singularity", "apptainer-on-singularity", "docker", "shifter",
        "docker-without-a-profile", "enroot-image-file", "enroot-without-a-profile",
        "enroot-bash-c", "apptainer-bash-c",
    ],
)  # fmt: skip
def test_a_container_maps_to_the_profiles_container(
    cluster: str, launch: str, image: str | None, listed: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterkit.load.loader import load_profile
    from clusterkit.load.script_text import parse_script

    monkeypatch.setenv("CLUSTERKIT_CLUSTERS", str(REPO / "recipes" / "clusters"))  # this checkout's profiles
    profile = load_profile(cluster, REPO)[0]
    imported = import_script(parse_script(f"#SBATCH -N 1\n{launch}\n", "job.sh"), profile)
    assert imported.recipe.get("container_image") == image
    assert imported.recipe["task"] == {"script": "a.py"}
    assert [item.why for item in imported.unmapped if item.why == listed] == ([listed] if listed else [])
    assert not [item for item in imported.unmapped if item.why.startswith("a container") and not listed]
    checked(recipe_yaml(imported, "job.sh", cluster), None)  # validates


def test_a_hand_written_enroot_job_maps_its_image_and_mounts_and_lists_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clusterkit.load.loader import load_profile
    from clusterkit.load.script_text import parse_script

    monkeypatch.setenv("CLUSTERKIT_CLUSTERS", str(REPO / "recipes" / "clusters"))
    profile = load_profile("enroot-h100", REPO)[0]
    text = (
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\n"
        "IMG=/scratch/me/pt.sqsh\n"  # line 4
        "enroot import -o $IMG docker://nvcr.io#nvidia/pytorch:24.10-py3\n"  # line 5: mapped
        'srun --ntasks-per-node=1 enroot create --force --name pt "$IMG"\n'  # line 6: mapped
        "enroot import docker://ubuntu:22.04\n"  # line 7: its file is enroot's to name
        'srun enroot create --name other "$(pick)"\n'  # line 8: a run-time image
        "srun enroot start --rw --mount /shared/data:/shared/data --mount=/scratch:/scratch "
        "--env NCCL_DEBUG --root pt torchrun --nproc-per-node=8 train.py\n"  # line 9: the launch
        "srun --ntasks-per-node=1 enroot remove -f pt\n"  # line 10: clusterkit removes its own
    )
    imported = import_script(parse_script(text, "job.sh"), profile)
    recipe = imported.recipe
    assert recipe["container_image"] == "docker://nvcr.io#nvidia/pytorch:24.10-py3"
    assert recipe["launcher"] == "torchrun" and recipe["task"] == {"script": "train.py"}
    assert "launcher_args" not in recipe
    listed = sorted((item.line, item.text, item.why) for item in imported.unmapped)
    assert listed == [
        (7, "enroot import docker://ubuntu:22.04", "an enroot import without --output: the file is enroot's to name"),
        (8, 'srun enroot create --name other "$(pick)"', "an enroot create of an image only the shell knows"),
        (9, "--mount=/scratch:/scratch", "a mount the cluster profile's container has not"),
        (9, "--root", "an enroot start option the cluster profile's container does not give"),
        (9, "--rw", "an enroot start option the cluster profile's container does not give"),
    ]
    hooks = recipe.get("hooks", {}).get("pre_launch", []) + recipe.get("hooks", {}).get("post_run", [])
    assert not any(line in hooks for line in text.splitlines()[4:6] + text.splitlines()[9:10])
    assert {5, 6, 9, 10} <= set(imported.mapped)
    checked(recipe_yaml(imported, "job.sh", "enroot-h100"), None)  # validates


def test_enroot_start_of_the_profiles_image_names_no_image_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterkit.load.loader import load_profile
    from clusterkit.load.script_text import parse_script

    monkeypatch.setenv("CLUSTERKIT_CLUSTERS", str(REPO / "recipes" / "clusters"))
    profile = load_profile("enroot-h100", REPO)[0]
    text = (
        "#SBATCH -N 1\nenroot import --output=/s/pt.sqsh 'docker://nvcr.io#nvidia/pytorch:24.05-py3'\n"
        "enroot create -n pt /s/pt.sqsh\nsrun env A=1 enroot start pt python a.py\n"
    )
    imported = import_script(parse_script(text, "job.sh"), profile)
    assert "container_image" not in imported.recipe and imported.recipe["task"] == {"script": "a.py"}
    assert imported.recipe["env"]["A"] == "1" and imported.unmapped == []
    unnamed = import_script(parse_script("#SBATCH -N 1\nsrun enroot start nobody python a.py\n", "job.sh"), profile)
    assert [item.why for item in unnamed.unmapped] == [
        "a container the recipe cannot name: the program would run outside it"
    ]


@pytest.mark.parametrize(
    "cluster, source",
    [("enroot-h100", "docker://$REGISTRY/pt:1"), ("dev", "docker://nvcr.io#nvidia/pytorch:24.05-py3")],
    ids=["run-time-image", "no-enroot-profile"],
)
def test_enroot_steps_no_recipe_container_takes_stay_hook_lines_and_are_listed(
    cluster: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterkit.load.loader import load_profile
    from clusterkit.load.script_text import parse_script

    monkeypatch.setenv("CLUSTERKIT_CLUSTERS", str(REPO / "recipes" / "clusters"))
    profile = load_profile(cluster, REPO)[0]
    text = f"#SBATCH -N 1\nenroot import -o /s/pt.sqsh {source}\nenroot create -n pt /s/pt.sqsh\nsrun enroot start pt python a.py\n"
    imported = import_script(parse_script(text, "job.sh"), profile)
    assert "container_image" not in imported.recipe
    assert imported.recipe["hooks"]["pre_launch"] == text.splitlines()[1:3]
    listed = [(item.line, item.why) for item in imported.unmapped]
    assert (4, "a container the recipe cannot name: the program would run outside it") in listed
    assert [line for line, _ in listed if line in (2, 3)] == [2, 3]


@pytest.mark.parametrize(
    "line, words",
    [
        ("enroot import docker://nvcr.io#nvidia/pytorch:24.05-py3 # pull", ["enroot", "import", "docker://nvcr.io#nvidia/pytorch:24.05-py3"]),
        ("echo $# ${#A} '#q' \"#d\" \\#e a\\ #f;#g", ["echo", "$#", "${#A}", "#q", "#d", "#e", "a #f", ";"]),
        ("a|#b", ["a", "|"]),
    ],
)  # fmt: skip
def test_a_comment_starts_a_word_as_in_bash(line: str, words: list[str]) -> None:
    from clusterkit.load.script_text import words_of

    assert words_of(line) == words


def test_what_the_launch_line_holds_beside_the_launch_is_mapped_or_listed() -> None:
    from clusterkit.load.script_text import parse_script

    text = "#SBATCH -N 2\nFOO=1 srun bash -c 'cd /work; RANK=$SLURM_PROCID BAR=$(date) python a.py' > out.log 2>&1\n"
    imported = import_script(parse_script(text, "job.sh"))
    assert imported.recipe["env"]["FOO"] == "1" and "RANK" not in imported.recipe["env"]
    assert sorted(item.why for item in imported.unmapped) == [
        "a redirection of the launch", "a redirection of the launch", "a run-time value on the launch line",
        "beside the launch in its bash -c",
    ]  # fmt: skip
    assert imported.recipe["task"] == {"script": "a.py"} and imported.recipe["launcher"] == "python"
    again = import_script(parse_script("#SBATCH -N 1\nsrun python a.py --x 1 2>&1 --y 3 >log\n", "job.sh"))
    assert again.recipe["task"] == {"script": "a.py", "args": ["--x", "1", "--y", "3"]}


def test_successive_path_edits_of_one_variable_all_stay() -> None:
    """torchtitan's multinode_trainer.slurm prepends twice to LD_LIBRARY_PATH: both directories
    reach the job, in the script's order (the last prepend first)."""
    recipe = _recipe(
        HEADER + "export LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH\nexport LD_LIBRARY_PATH=/usr/local/lib/:"
        "$LD_LIBRARY_PATH\nexport PATH=$PATH:/a\nexport PATH=$PATH:/b\nsrun python a.py\n"
    )
    assert recipe["env"]["LD_LIBRARY_PATH"] == {"prepend": "/usr/local/lib/:/opt/efa/lib"}
    assert recipe["env"]["PATH"] == {"append": "/a:/b"}


def test_a_python_command_in_the_batch_shell_before_the_srun_launch_is_not_the_launch() -> None:
    """BLOOM's tr11-176B-ml.slurm runs two helper `python` commands in the batch shell, then its
    launch under srun through shell variables: the helpers are hooks, not a python task per GPU."""
    recipe = _recipe(HEADER + 'python prep.py --out data.txt\nCMD=train.py\nsrun $SRUN_ARGS bash -c "$CMD"\n')
    assert recipe["hooks"]["pre_launch"] == ["python prep.py --out data.txt"]
    assert recipe.get("launcher") != "python"


def test_a_launch_built_from_the_scripts_own_variables_is_read() -> None:
    """ml-engineering's launchers (and BLOOM's) build the launch in variables: `srun $SRUN_ARGS
    bash -c "$CMD"`, CMD="$LAUNCHER $PROGRAM". Their literal values are the launch line's words."""
    recipe = _recipe(
        HEADER + 'LAUNCHER="python -u -m torch.distributed.run \\\n  --nproc_per_node 4 --nnodes 2 \\\n'
        '  --node_rank \\$SLURM_PROCID --max_restarts 0 --role \\$(hostname -s): \\\n  "\nPROGRAM="train.py --lr 1"\n'
        'export CMD="$LAUNCHER $PROGRAM"\nSRUN_ARGS=" --wait=60 --kill-on-bad-exit=1 "\n'
        'srun $SRUN_ARGS bash -c "$CMD"\n'
    )
    assert (recipe["launcher"], recipe["python"], recipe["task"]) == (
        "torchrun",
        ["python", "-u"],
        {"script": "train.py", "args": ["--lr", "1"]},
    )
    assert recipe["launcher_args"] == ["--max_restarts=0"]  # --role $(...): a run-time value, listed
    assert recipe["srun"]["wait"] == 60 and recipe["srun"]["kill_on_bad_exit"] is True


def test_a_launch_built_from_variables_with_a_computed_part_is_read_and_the_part_listed() -> None:
    """accelerate's examples/slurm/submit_multinode.sh: LAUNCHER holds `$((...))` and CMD is
    "$LAUNCHER $SCRIPT", run as `srun $CMD`: the launch is accelerate's, the computed value listed."""
    from clusterkit.load.script_text import parse_script

    imported = import_script(
        parse_script(
            HEADER + 'export LAUNCHER="accelerate launch --num_processes $((SLURM_NNODES * 4)) --num_machines 2"\n'
            'export SCRIPT="/x/train.py"\nexport CMD="$LAUNCHER $SCRIPT --lr 1"\nT=$(date)\nexport T\nsrun $CMD\n',
            "job.sh",
        )
    )
    assert imported.launch is not None and imported.launch.launcher == "accelerate"
    assert imported.recipe["task"] == {"script": "/x/train.py", "args": ["--lr", "1"]}
    assert "\x00" not in json.dumps(imported.recipe)  # the computed value's marker reaches no field
    assert [u.line for u in imported.unmapped if "computed" in u.why] == [4, 7]


def test_accelerates_c10d_rendezvous_is_listed_not_mapped() -> None:
    """`accelerate launch --rdzv_backend c10d` (accelerate's submit_multinode.sh): clusterkit's
    rendezvous field is torchrun's and refuses accelerate; the option is listed, the recipe validates."""
    from clusterkit.load.script_text import parse_script

    imported = import_script(parse_script(HEADER + "srun accelerate launch --rdzv_backend c10d a.py\n", "job.sh"))
    assert "rendezvous" not in imported.recipe
    assert any(u.text == "--rdzv-backend=c10d" for u in imported.unmapped)


def test_a_comment_line_ending_in_a_backslash_continues_nothing() -> None:
    """BLOOM's tr11-176B-ml.slurm comments out an option as `#    --universal-checkpoint \\` just
    before `export CMD=...`: bash ends a comment at the line break, so the export is a command."""
    recipe = _recipe(HEADER + "#    --universal-checkpoint \\\nexport FOO=1\nsrun python a.py\n")
    assert recipe["env"]["FOO"] == "1"


def test_a_tab_in_a_command_is_whitespace_not_a_control_character() -> None:
    """Megatron-LM's pretrain_gpt3_175B.sh indents its `options="... \\` lines with tabs."""
    recipe = _recipe(HEADER + 'options=" \\\n\t--num-layers 96 \\\n\t--lr 1"\nsrun python a.py ${options}\n')
    assert recipe["task"]["args"] == ["--num-layers", "96", "--lr", "1"]


def test_a_quoted_value_over_several_lines_still_builds_the_launch() -> None:
    """open-r1's slurm/train.slurm: `export CMD=" \\` then `src/open_r1/$TASK.py ...` and a line
    break before the closing quote; `srun $SRUN_ARGS bash -c "$LAUNCHER $CMD"` reads it."""
    recipe = _recipe(
        HEADER + 'export CMD=" \\\n    train.py --config c.yaml\n    "\nexport LAUNCHER="accelerate launch \\\n'
        '    --num_machines 2 \\\n    "\nSRUN_ARGS=" \\\n    --wait=60\n    "\nexport SRUN_ARGS\nexport B="$CMD"\n'
        'srun $SRUN_ARGS bash -c "$LAUNCHER $CMD"\n'
    )
    assert "SRUN_ARGS" not in recipe["env"] and "B" not in recipe["env"]  # a line break reaches no field
    assert (recipe["launcher"], recipe["task"]) == (
        "accelerate",
        {"script": "train.py", "args": ["--config", "c.yaml"]},
    )
    assert recipe["srun"]["wait"] == 60


def test_a_variable_set_again_in_a_conditional_or_loop_is_a_run_time_value() -> None:
    """open-r1's slurm/train.slurm sets ACCELERATOR="" and then again in its option-parsing loop:
    the launch's `--config_file configs/$ACCELERATOR.yaml` is then not `configs/.yaml`."""
    from clusterkit.load.script_text import parse_script

    imported = import_script(
        parse_script(
            HEADER + 'ACC=""\nwhile [[ $# -gt 0 ]]; do\n  case $1 in\n    --acc) ACC="$2"; shift 2 ;;\n  esac\n'
            "done\nsrun python train.py --config configs/$ACC.yaml\n",
            "job.sh",
        )
    )
    assert "args" not in imported.recipe["task"]  # a run-time value never reaches argv as text
    assert any(u.text == "--config configs/$ACC.yaml" for u in imported.unmapped)


def test_srun_with_no_options_before_its_command_is_the_launch() -> None:
    """`srun ${AUTO_RESUME} -l ...` (awsome-distributed-training, AUTO_RESUME set in an `if`) and a
    plain `srun ./run.sh`: srun with no option before the command still launches it."""
    for line in ("srun ./run.sh --epochs 3", "srun ${AUTO_RESUME} -l torchrun --nnodes=2 train.py"):
        recipe = _recipe(HEADER + line + "\n")
        assert recipe["task"]["script"] != "true", line


def test_an_accelerate_config_path_read_at_run_time_is_listed() -> None:
    """open-r1: `--config_file recipes/accelerate_configs/$ACCELERATOR.yaml` (ACCELERATOR from the
    script's options): no file to name in accelerate.config, so it is listed and the recipe validates."""
    from clusterkit.load.script_text import parse_script

    imported = import_script(parse_script(HEADER + "srun accelerate launch --config_file c/$ACC.yaml a.py\n", "j.sh"))
    assert "accelerate" not in imported.recipe
    assert any(u.text == "--config-file=c/$ACC.yaml" and "run-time" in u.why for u in imported.unmapped)


def test_variables_doubling_each_line_are_read_in_bounded_time_and_memory() -> None:
    """V1="$V0 $V0", V2="$V1 $V1", ...: read literally, 25 lines are 2^25 copies. The values read
    into one are at most a line's limit; past it a variable is a run-time value, listed."""
    from clusterkit.load.script_text import parse_script

    lines = ["V0=xxxxxxxxxxxxxxxx", *(f'V{i}="$V{i - 1} $V{i - 1}"' for i in range(1, 26))]
    started = time.monotonic()
    imported = import_script(parse_script(HEADER + "\n".join(lines) + "\nsrun python a.py $V25\n", "job.sh"))
    assert time.monotonic() - started < 10
    assert sum(map(len, imported.recipe["task"]["args"])) <= 4 * 65536
    assert any("run-time value in an argument" in u.why for u in imported.unmapped)
    started = time.monotonic()  # one line reading a large value many times
    text = HEADER + f"V={'x' * 60000}\nsrun python a.py" + " $V" * 5000 + "\n"
    imported = import_script(parse_script(text, "job.sh"))
    assert time.monotonic() - started < 10
    assert sum(map(len, imported.recipe["task"]["args"])) <= 4 * 65536

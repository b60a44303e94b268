"""enroot called directly (issue 31), and the recipe's hooks inside the job's container.

enroot is not a Debian package (NVIDIA ships it from GitHub releases, and it needs squashfs images
from a registry, which tests cannot reach), so the jobs here run the container STAND-IN
(tests/scripts/container-standin/standin.py, through a link named enroot): it takes exactly
``enroot import --output=FILE docker://...``, ``enroot create --force --name=NAME -- IMAGE.sqsh``,
``enroot start [--mount=SRC:DST] [--env=NAME] NAME COMMAND...`` and ``enroot remove --force -- NAME``,
keeps each node's containers in its own folder of ENROOT_DATA_PATH (start refuses a container not
created on its node), records each call and runs the command on the host with only the variables named."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.spec.launch_plan import IMAGE_CHECK
from clusterkit.spec.runtime_values import placeholders
from clusterkit.supervisor.plan import expand
from conftest import REPO, run_cli
from launch_plans import plan_of
from test_container_runtimes import HOSTILE, STANDIN, _profile, _recipe, _refused

REGISTRY_IMAGE = "nvcr.io#nvidia/pytorch:24.01-py3"  # enroot's docker://[REGISTRY#]IMAGE[:TAG]


def _job(
    tmp_path: Path, image: str, *executor: str, expect: int = 0, runtime: str = "enroot", **fields
) -> tuple[Path, list[dict]]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    _profile(tmp_path, runtime=runtime, image=image, mounts=[str(data)])
    env = {"PATH": {"prepend": str(STANDIN)}, "MY_SETTING": "x y", "ENROOT_DATA_PATH": str(tmp_path / "enroot")}
    path = _recipe(tmp_path, env=env, **fields)
    done = run_cli("submit", str(path), *executor, "--follow", cwd=tmp_path, env=dict(os.environ, ONLY_ON_THE_HOST="1"))
    run_dir = next((tmp_path / "runs" / "boxed").iterdir())
    assert (run_dir / "exit_code").read_text() == f"{expect}\n", done.stdout + done.stderr
    recorded = run_dir / "container-calls.jsonl"
    calls = [json.loads(line) for line in recorded.read_text().splitlines()] if recorded.exists() else []
    return run_dir, calls


def _filled_in(argv: tuple[str, ...], expand_at: tuple[int, ...], run_dir: Path) -> list[str]:
    values = {"job_id": run_dir.name, "run_dir": str(run_dir), "uid": str(os.getuid()), "gid": str(os.getgid())}
    return [expand(word, values) if index in expand_at else word for index, word in enumerate(argv)]


def _assert_the_enroot_job(tmp_path: Path, run_dir: Path, calls: list[dict], nodes: set[str], imported: bool) -> None:
    """Import once (a registry image), create once per node, start per rank with the plan's argv,
    remove once per node at the end: nothing left in any node's enroot data, nor the imported file."""
    plan = plan_of(render_job(load_recipe(tmp_path / "boxed.yaml")))
    verbs = [call["verb"] for call in calls]
    assert verbs == ["import"] * imported + ["create"] * 2 + ["start"] * 4 + ["remove"] * 2, verbs
    setup = plan.container_setup
    if imported:
        assert calls[0]["argv"] == _filled_in(setup.import_.argv, setup.import_.expand, run_dir)[1:]
        assert calls[0]["image"] == "docker://" + REGISTRY_IMAGE
    made = [call for call in calls if call["verb"] == "create"]
    assert {call["node"] for call in made} == nodes
    assert all(call["argv"] == _filled_in(setup.create.argv, setup.create.expand, run_dir)[1:] for call in made)
    for call in (call for call in calls if call["verb"] == "start"):
        assert _filled_in(plan.launch.argv, plan.launch.expand, run_dir)[2:] == ["enroot", *call["argv"]]
        assert f"--mount={run_dir}:{run_dir}" in call["argv"] and f"clusterkit-{run_dir.name}" in call["argv"]
        assert call["command"] == ["python3", f"{run_dir}/code/tests/scripts/echo_contract.py"]
    assert {call["node"] for call in calls if call["verb"] == "remove"} == nodes
    assert not any((tmp_path / "enroot").glob("*/*")), "a container was left on a node"
    assert not (run_dir / "enroot-image.sqsh").exists()
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3] and {r["node"] for r in ranks} == nodes
    assert all(r["env"]["MY_SETTING"] == "x y" and "ONLY_ON_THE_HOST" not in r["env"] for r in ranks)
    # Named but unset on the node (no array, no retry): unset in the container too, not empty.
    assert not any({"SLURM_ARRAY_TASK_ID", "CLUSTERKIT_RETRY_OF"} & set(r["env"]) for r in ranks)


def test_a_two_node_job_imports_creates_starts_and_removes_its_enroot_container(tmp_path: Path) -> None:
    """Under the local executor, a registry image, through the stand-in (see the module's docstring)."""
    run_dir, calls = _job(tmp_path, REGISTRY_IMAGE, "--executor", "local")
    _assert_the_enroot_job(tmp_path, run_dir, calls, {"127.0.0.1", "127.0.0.2"}, imported=True)


def test_a_squashfs_image_is_created_from_where_it_is(tmp_path: Path) -> None:
    image = tmp_path / "train.sqsh"
    image.write_text("stand-in image")
    run_dir, calls = _job(tmp_path, str(image), "--executor", "local")
    _assert_the_enroot_job(tmp_path, run_dir, calls, {"127.0.0.1", "127.0.0.2"}, imported=False)
    assert {call["image"] for call in calls if call["verb"] == "create"} == {str(image)}
    assert image.read_text() == "stand-in image"  # the user's file: used, never removed


@pytest.mark.slurm
def test_a_two_node_job_imports_creates_starts_and_removes_its_enroot_container_on_the_dev_cluster(
    dev_cluster: str, tmp_path: Path
) -> None:
    """The same job on the dev cluster's two nodes (srun's tasks, SLURM's variables and the node agent
    are the real ones), through the same stand-in: enroot is not a Debian package."""
    run_dir, calls = _job(tmp_path, REGISTRY_IMAGE)
    _assert_the_enroot_job(tmp_path, run_dir, calls, {"node1", "node2"}, imported=True)


@pytest.mark.parametrize(
    "image, gpu, workdir, says",
    [
        ("/images/train.sif", None, None, "enroot runs a squashfs image (.sqsh) or a registry image"),
        ("/images/sandbox/", None, None, "enroot cannot run a sandbox folder"),
        ("oras://r/train:1", None, None, "enroot cannot run an Apptainer URI"),
        ("r/train:1", "amd", None, "enroot cannot give a container amd GPUs"),
        ("r/train:1", None, "/work", "enroot has no working-directory option"),
    ],
)
def test_what_enroot_cannot_do_is_refused_in_one_line(
    tmp_path: Path, image: str, gpu: str | None, workdir: str | None, says: str
) -> None:
    container = {"runtime": "enroot", "image": image, **({"workdir": workdir} if workdir else {})}
    _profile(tmp_path, {"model": "G", "memory_gb": 80, "vendor": gpu} if gpu else None, **container)
    assert says in _refused(_recipe(tmp_path))


@pytest.mark.parametrize("mount", ["/data/my files:/data", "/a:/b:ro:extra", "/a\t:/b"])
def test_a_mount_enroot_cannot_read_is_refused_in_one_line(tmp_path: Path, mount: str) -> None:
    _profile(tmp_path, runtime="enroot", image="r/t:1", mounts=[mount])
    assert "container.mounts[0]: enroot takes host[:container[:options]] without spaces" in _refused(_recipe(tmp_path))


def test_a_runs_directory_with_a_space_is_refused_under_enroot(tmp_path: Path) -> None:
    _profile(tmp_path, runtime="enroot", image="r/t:1")
    assert "holds a space, which enroot's --mount cannot carry" in _refused(
        _recipe(tmp_path, runs_dir=f"{tmp_path}/my runs")
    )


def test_mounts_are_given_in_enroots_fstab_form(tmp_path: Path) -> None:
    """host[:container[:options]] as for every runtime; enroot would read a bare third field as the
    filesystem type, so options go in its fourth, after a bind (as pyxis writes them)."""
    _profile(tmp_path, runtime="enroot", image="r/t:1", mounts=["/data", "/scratch:/s", "/ro:/ro:ro"])
    argv = plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch.argv
    assert [word for word in argv if word.startswith("--mount=")] == [
        "--mount=/data:/data",
        "--mount=/scratch:/s",
        "--mount=/ro:/ro:none:x-create=auto,rbind,ro",
        "--mount={run_dir}:{run_dir}",
    ]


def test_enroot_gets_nvidia_gpus_through_its_hook_and_slurms_binding_by_name(tmp_path: Path) -> None:
    _profile(tmp_path, {"model": "G", "memory_gb": 80, "vendor": "nvidia"}, runtime="enroot", image="r/t:1")
    argv = plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch.argv
    assert "--env=NVIDIA_VISIBLE_DEVICES=all" in argv and "CUDA_VISIBLE_DEVICES" in argv[1].split()


def test_the_configuration_script_passes_set_variables_as_they_are_and_evaluates_nothing(tmp_path: Path) -> None:
    """enroot sources supervisor/enroot_environ.sh and writes what environ() prints into the
    container's environment file, one KEY=VALUE a line: a named variable that is set is passed as it
    is, an unset one not at all, one holding a line break not at all (it would inject a variable), and
    a name that is not one (an array subscript would be evaluated by ${!name}) is skipped."""
    canary = tmp_path / "canary"
    hostile = f"x[$(touch {canary})]"
    names = f"PLAIN EMPTY TRICKY UNSET BROKEN {hostile} 1BAD"
    env = {"PATH": os.environ["PATH"], "CLUSTERKIT_CONTAINER_ENV": names, "PLAIN": "a b", "EMPTY": ""}
    env.update(TRICKY="$(touch " + str(canary) + ") ' \" % *", BROKEN="one\nINJECTED=1")
    script = REPO / "clusterkit" / "supervisor" / "enroot_environ.sh"
    done = subprocess.run(["bash", "-c", 'source "$1"; environ', "conf", str(script)], env=env, capture_output=True)
    assert done.returncode == 0 and not canary.exists()
    assert done.stdout.decode().splitlines() == ["PLAIN=a b", "EMPTY=", f"TRICKY={env['TRICKY']}"]
    assert done.stderr.decode() == "clusterkit: BROKEN holds a line break, which enroot cannot pass: not passed\n"


def _hook_calls(calls: list[dict]) -> list[dict]:
    return [call for call in calls if call.get("command", [])[:1] == ["bash"]]


def test_hooks_in_container_run_through_the_runtime_the_tasks_get(tmp_path: Path) -> None:
    """hooks.in_container: both hooks run in the batch shell through the tasks' own runtime command
    (enroot start of the job's container, the run directory mounted, variables by name), the
    post_run hook told the exit code."""
    _assert_the_hooks_ran_in_the_container(tmp_path, "--executor", "local")


@pytest.mark.slurm
def test_hooks_in_container_run_through_the_runtime_the_tasks_get_on_the_dev_cluster(
    dev_cluster: str, tmp_path: Path
) -> None:
    """The same on the dev cluster: the batch shell is on the allocation's first node, where the job's
    container was created (the stand-in's start refuses one not created on its node)."""
    _assert_the_hooks_ran_in_the_container(tmp_path)


def _assert_the_hooks_ran_in_the_container(tmp_path: Path, *executor: str) -> None:
    hooks = {
        "in_container": True,
        "pre_launch": ['echo "pre:$MY_SETTING:${ONLY_ON_THE_HOST-unset}" > "$RUN_DIR/pre.txt"'],
        "post_run": ['echo "post:$CLUSTERKIT_EXIT_CODE" > "$RUN_DIR/post.txt"'],
    }
    run_dir, calls = _job(tmp_path, REGISTRY_IMAGE, *executor, hooks=hooks)
    plan = plan_of(render_job(load_recipe(tmp_path / "boxed.yaml")))
    ran = _hook_calls(calls)
    assert len(ran) == 2
    for call in ran:
        runtime = _filled_in(plan.hooks_container.argv, plan.hooks_container.expand, run_dir)
        assert runtime[2:] == ["enroot", *call["argv"][: -len(call["command"])]]
    assert ran[0]["command"][:4] == ["bash", "-e", "-o", "pipefail"] and ran[1]["command"][:2] == ["bash", "-c"]
    assert "CLUSTERKIT_EXIT_CODE" in ran[1]["env"]
    assert (run_dir / "pre.txt").read_text() == "pre:x y:unset\n"  # the job's variables, not the host's others
    assert (run_dir / "post.txt").read_text() == "post:0\n"
    assert not any((tmp_path / "enroot").glob("*/*"))  # removed after post_run ran in it


@pytest.mark.parametrize(
    "runtime, image", [("docker", "ghcr.io/me/train:1"), ("singularity", "{tmp}/train.sif"), ("shifter", "me/train:1")]
)
def test_hooks_in_container_run_through_each_runtimes_own_command(tmp_path: Path, runtime: str, image: str) -> None:
    """The other runtimes the same way: their command, as the plan builds it for the tasks (a docker
    container of its own, named for the hooks, given post_run's exit code by name)."""
    image = image.format(tmp=tmp_path)
    if runtime == "singularity":
        Path(image).write_bytes(b"stand-in image")
    hooks = {
        "in_container": True,
        "pre_launch": ['test -d "$RUN_DIR"'],
        "post_run": ['echo "post:$CLUSTERKIT_EXIT_CODE" > "$RUN_DIR/post.txt"'],
    }
    run_dir, calls = _job(tmp_path, image, "--executor", "local", runtime=runtime, hooks=hooks)
    plan = plan_of(render_job(load_recipe(tmp_path / "boxed.yaml")))
    ran = _hook_calls(calls)
    assert [call["command"][:2] for call in ran] == [["bash", "-e"], ["bash", "-c"]]
    for call in ran:
        argv = [runtime, *call["argv"][: -len(call["command"])]]
        assert argv == _filled_in(plan.hooks_container.argv, plan.hooks_container.expand, run_dir)
    if runtime == "docker":
        assert f"--name=clusterkit-{run_dir.name}-hooks" in ran[0]["argv"]
    assert (run_dir / "post.txt").read_text() == "post:0\n"


@pytest.mark.parametrize("hook, line, job_exit", [("pre_launch", "exit 3", 3), ("post_run", "exit 4", 0)])
def test_a_failing_hook_in_the_container_is_handled_as_a_host_hook(
    tmp_path: Path, hook: str, line: str, job_exit: int
) -> None:
    """pre_launch failing stops the job with its code before the launch; post_run failing leaves the
    job's exit code as it was; the container is removed either way."""
    run_dir, calls = _job(
        tmp_path, REGISTRY_IMAGE, "--executor", "local", expect=job_exit, hooks={"in_container": True, hook: [line]}
    )
    launched = [call for call in calls if call.get("command", [])[:1] == ["python3"]]
    assert (not launched) == (hook == "pre_launch")
    assert _hook_calls(calls)[0]["command"][-1].strip().endswith(line)
    assert not any((tmp_path / "enroot").glob("*/*"))


def test_hooks_in_container_without_a_container_are_refused_in_one_line(tmp_path: Path) -> None:
    path = _recipe(tmp_path, hooks={"in_container": True, "post_run": ["true"]})
    _profile(tmp_path, runtime="pyxis", image="r/t:1")
    clusters = tmp_path / "clusters" / "boxed.yaml"
    profile = yaml.safe_load(clusters.read_text())
    del profile["container"]
    clusters.write_text(yaml.safe_dump(profile))
    assert "hooks.in_container: cluster profile 'boxed' runs no container" in _refused(path)


@pytest.mark.parametrize("hook, line, outcome", [("pre_launch", "exit 3", 3), ("post_run", "exit 4", 4)])
def test_hooks_in_a_pyxis_container_are_one_srun_task_with_the_launchs_container_options(
    tmp_path: Path, hook: str, line: str, outcome: int
) -> None:
    """pyxis enters its image through srun's options only: the hooks' bash runs as one srun task (on
    the allocation's first node, the batch shell's) with the launch's own --container-* options. The
    dev cluster has no pyxis plugin, so a fake srun here records the argv and runs the command after
    its options; the exit code is what the hooks module reports, as for a host hook."""
    from clusterkit.supervisor import hooks as run_hooks
    from clusterkit.supervisor.steps import batch_argv

    _profile(tmp_path, runtime="pyxis", image="nvcr.io#nvidia/pytorch:24.05-py3", mounts=["/data:/data:ro"])
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, hooks={"in_container": True, hook: [line]}))))
    step = plan.hooks_container
    assert step.argv[:4] == ("srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1")
    assert step.argv[4:] == tuple(word for word in plan.launch.srun if word.startswith("--container-"))
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"open({str(tmp_path / 'srun.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "rest = [word for word in sys.argv[1:] if not word.startswith('--')]\n"
        "os.execvp(rest[0], sys.argv[sys.argv.index(rest[0]):])\n"
    )
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", RUN_DIR=str(run_dir))
    runtime = batch_argv(step, env)
    if hook == "pre_launch":
        code, _ = run_hooks.pre_launch([line], env, runtime)
    else:
        code = run_hooks.post_run([line], env, 0, runtime)
    assert code == outcome
    argv = json.loads((tmp_path / "srun.json").read_text())
    assert f"--container-mounts=/data:/data:ro,{run_dir}:{run_dir}" in argv and argv[-1].strip().endswith(line)


def test_the_enroot_render_is_bash_and_shellcheck_clean(tmp_path: Path) -> None:
    _profile(tmp_path, runtime="enroot", image=REGISTRY_IMAGE)
    job = render_job(load_recipe(_recipe(tmp_path, hooks={"in_container": True, "post_run": ["true"]})))
    script = tmp_path / "job.sbatch"
    script.write_text(job.files["job.sbatch"])
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    conf = REPO / "clusterkit" / "supervisor" / "enroot_environ.sh"
    for checked in (script, conf):
        done = subprocess.run(["shellcheck", "-s", "bash", str(checked)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("key", ["image", "mounts", "options"])
def test_a_hostile_enroot_value_is_refused_in_one_line_or_passed_as_one_word(tmp_path: Path, key: str) -> None:
    """Each value stops at validate in one line naming its key, or reaches enroot (start's mounts and
    options; import's or create's image) in one argv word, exactly as written or with its run-time
    value filled in, never shell; the script stays bash."""
    for value in HOSTILE:
        as_written = f"/{value}" if key == "mounts" else value
        container = {"runtime": "enroot", "image": REGISTRY_IMAGE}
        container[key] = [as_written] if key in ("mounts", "options") else as_written
        _profile(tmp_path, **container)
        try:
            job = render_job(load_recipe(_recipe(tmp_path)))
        except RecipeError as refused:
            lines = str(refused).splitlines()
            assert all(line.isprintable() and f": container.{key}" in line for line in lines), (key, value, lines)
            continue
        plan = plan_of(job)
        setup = plan.container_setup
        steps = [plan.launch] if key != "image" else [step for step in (setup.import_, setup.create) if step]
        holding = [(step, at) for step in steps for at, word in enumerate(step.argv) if as_written in word]
        assert holding, (key, value)
        assert all((at in step.expand) == bool(placeholders(as_written)) for step, at in holding), (key, value)
        script = tmp_path / "job.sbatch"
        script.write_text(job.files["job.sbatch"])
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_profile_init_suggests_enroot_where_it_is_without_pyxis(tmp_path: Path) -> None:
    """An enroot on the PATH with no pyxis: the profile's container block to add names enroot, with an
    image of a kind it runs; where pyxis is, pyxis (which calls enroot itself) is suggested instead."""
    from test_profile_init import FakeHost, cluster, node, partition, written_round_trip

    answers = cluster([partition("gpu")], [node("n1", "gpu:8")])
    _, text = written_round_trip(tmp_path, FakeHost(answers, tools="enroot\n"))
    assert "# container: {image: nvcr.io#nvidia/pytorch:24.05-py3, runtime: enroot}\n" in text
    answers[("srun", "--help")] += "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH  [pyxis] the image\n"
    (tmp_path / "pyxis").mkdir()
    _, text = written_round_trip(tmp_path / "pyxis", FakeHost(answers, tools="enroot\n"))
    assert "runtime: enroot" not in text and "pyxis is here" in text


def test_the_image_check_runs_in_the_container_made_before_it(tmp_path: Path) -> None:
    """torchrun's launch imports torch: the image check runs `enroot start` of the job's container on
    the first node once it was created on every node, before each node's torchrun starts in it."""
    run_dir, calls = _job(tmp_path, REGISTRY_IMAGE, "--executor", "local", launcher="torchrun")
    verbs = [(call["verb"], (call.get("command") or [""])[0]) for call in calls]
    assert verbs[:4] == [("import", ""), ("create", ""), ("create", ""), ("start", "python3")]
    assert calls[3]["command"][1:3] == ["-c", IMAGE_CHECK] and calls[3]["node"] == "127.0.0.1"
    assert verbs[4:6] == [("start", "python3")] * 2 and {call["node"] for call in calls[4:6]} == {
        "127.0.0.1",
        "127.0.0.2",
    }
    assert calls[4]["command"][1:3] == ["-m", "torch.distributed.run"]
    assert verbs[6:] == [("remove", "")] * 2


def test_what_a_host_pre_launch_hook_exports_reaches_enroot(tmp_path: Path) -> None:
    """Hooks on the host run before the container is made: what they export (a registry token, an
    ENROOT_* setting) reaches enroot import, create, start and remove; hooks in the container run after."""
    elsewhere = tmp_path / "from-the-hook"
    hooks = {"pre_launch": [f"export ENROOT_DATA_PATH={elsewhere}"]}
    run_dir, calls = _job(tmp_path, REGISTRY_IMAGE, "--executor", "local", hooks=hooks)
    assert [call["verb"] for call in calls].count("start") == 4
    assert {path.name for path in elsewhere.iterdir()} == {"127.0.0.1", "127.0.0.2"}  # each node's, made there
    assert not any(elsewhere.glob("*/*")) and not (tmp_path / "enroot").exists()


def test_a_container_that_cannot_be_made_stops_the_job_before_anything_starts_in_it(tmp_path: Path) -> None:
    """enroot create fails (the image is not there): the job stops with one line and create's exit
    code, nothing starts in a container, and the remove step still runs on every node."""
    run_dir, calls = _job(tmp_path, str(tmp_path / "missing.sqsh"), "--executor", "local", expect=1)
    assert calls == []  # create refused before recording, nothing started
    log = "".join(path.read_text() for path in run_dir.glob("*_log.out"))
    assert "clusterkit: the container could not be made ready (1): not training" in log
    errors = "".join(path.read_text() for path in run_dir.glob("*_log.err"))
    assert errors.count("not a squashfs image") == 2 and errors.count("no such container") == 2


def test_a_hook_runtime_value_not_set_stops_the_job_in_one_line(tmp_path: Path) -> None:
    """A mount naming a variable of the job's environment ({env:NAME}) that is not set: the hooks'
    runtime command cannot be filled in, so the job says which variable in one line and stops with
    exit 2 before the launch, as a step would (no traceback), and its container is removed."""
    data = tmp_path / "data"
    data.mkdir()
    _profile(tmp_path, runtime="enroot", image=REGISTRY_IMAGE, mounts=["/{env:CK_NOT_SET}:/x"])
    env = {"PATH": {"prepend": str(STANDIN)}, "ENROOT_DATA_PATH": str(tmp_path / "enroot")}
    path = _recipe(tmp_path, env=env, hooks={"in_container": True, "pre_launch": ["true"]})
    run_cli("submit", str(path), "--executor", "local", "--follow", cwd=tmp_path)
    run_dir = next((tmp_path / "runs" / "boxed").iterdir())
    assert (run_dir / "exit_code").read_text() == "2\n"
    log = "".join(path.read_text() for path in run_dir.glob("*_log.*"))
    assert "clusterkit: {env:CK_NOT_SET} in the hooks step: the variable CK_NOT_SET is not set on" in log
    assert "Traceback" not in log and not any((tmp_path / "enroot").glob("*/*"))

"""Container runtimes beyond pyxis and Apptainer (issue 31): Singularity, Docker, Podman and Shifter,
from the one capability table (clusterkit.spec.containers): what each can run, how it gets the GPUs,
what is refused in one line, and what each node's task runs.

No real container runs in tests: Singularity and Shifter are not Debian packages, and docker/podman
have neither a daemon nor an image (there is no registry access). The end-to-end tests run a
STAND-IN (tests/scripts/container-standin/standin.py, through links named singularity, docker,
podman and shifter) first on PATH: it accepts exactly the options clusterkit writes with each
runtime's rules where they can be checked without an image (mount sources exist, docker's user is
the job's, variables go to docker/podman by name and only those reach the command), records the
argv, and runs the command on the host."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.spec import containers
from clusterkit.spec.launch_plan import IMAGE_CHECK
from clusterkit.spec.runtime_values import placeholders
from clusterkit.supervisor.plan import expand
from conftest import REPO, run_cli
from launch_plans import plan_of, started, task_argv

STANDIN = REPO / "tests" / "scripts" / "container-standin"
SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")


def _profile(tmp_path: Path, gpu: dict | None = None, **container) -> None:
    clusters = tmp_path / "clusters"
    clusters.mkdir(exist_ok=True)
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    profile.update(name="boxed", container=container)
    if gpu is not None:
        profile.update(accelerator="gpu", gpu_request="gres", gpu=gpu)
    (clusters / "boxed.yaml").write_text(yaml.safe_dump(profile))


def _recipe(tmp_path: Path, **fields) -> Path:
    body = {
        "name": "boxed",
        "cluster": "boxed",
        "runs_dir": str(tmp_path / "runs"),
        "launcher": "python",
        "resources": {"nodes": 2, "time": "5"},
        "task": {"script": SCRIPT},
        **fields,
    }
    path = tmp_path / "boxed.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _refused(path: Path) -> str:
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    message = str(raised.value)
    assert "\n" not in message.strip(), message
    return message


def test_the_profiles_runtime_names_are_the_tables() -> None:
    import msgspec.inspect as mi

    from clusterkit.spec.profile import Container

    runtime = next(field for field in mi.type_info(Container).fields if field.name == "runtime")
    assert set(runtime.type.values) == set(containers.RUNTIMES)


@pytest.mark.parametrize(
    "image, kind",
    [
        ("/images/train.sif", containers.FILE),
        ("train.sqsh", containers.FILE),
        ("/images/sandbox", containers.FOLDER),
        ("sandbox/", containers.FOLDER),
        ("./sandbox", containers.FOLDER),
        ("docker://nvcr.io/nvidia/pytorch:24.05-py3", containers.REGISTRY),
        ("docker:nersc/pytorch:24.06", containers.REGISTRY),  # Shifter's spelling
        ("nvcr.io/nvidia/pytorch:24.05-py3", containers.REGISTRY),
        ("localhost:5000/train", containers.REGISTRY),
        ("nvcr.io#nvidia/pytorch:24.05-py3", containers.REGISTRY),  # pyxis/enroot's
        ("oras://ghcr.io/x/train.sif:1", containers.URI),
        ("docker-archive:/images/train.tar", containers.URI),
    ],
)
def test_what_an_image_names(image: str, kind: str) -> None:
    assert containers.image_kind(image) == kind


@pytest.mark.parametrize(
    "container, gpu, message",
    [
        (
            {"runtime": "shifter", "image": "/images/train.sif"},
            None,
            "container.image: shifter cannot run an image file (.sif, .sqsh) (/images/train.sif); it runs a registry",
        ),
        ({"runtime": "docker", "image": "/images/sandbox/"}, None, "docker cannot run a sandbox folder"),
        ({"runtime": "docker", "image": "/images/train.sif"}, None, "docker cannot run an image file"),
        ({"runtime": "podman", "image": "oras://ghcr.io/x:1"}, None, "podman cannot run an Apptainer URI"),
        ({"runtime": "pyxis", "image": "/images/sandbox/"}, None, "pyxis cannot run a sandbox folder"),
        (
            {"runtime": "shifter", "image": "nvcr.io/nvidia/pytorch:24.05-py3"},
            {"model": "MI300X", "memory_gb": 192, "vendor": "amd"},
            "container.runtime: shifter cannot give a container amd GPUs; use pyxis, apptainer, singularity, docker, podman",
        ),
        (
            {"runtime": "docker", "image": "x", "mounts": ["data:/data"]},
            None,
            "container.mounts[0]: docker takes one mount",
        ),
        ({"runtime": "podman", "image": "x", "mounts": ["/a,/b"]}, None, "container.mounts[0]: podman takes one mount"),
        ({"runtime": "shifter", "image": "x", "mounts": ["/a", "~/b"]}, None, "container.mounts[1]: shifter takes one"),
        # An image the runtime would read as an option, or a reference that is not one.
        ({"runtime": "docker", "image": "--privileged"}, None, "container.image: --privileged starts with '-'"),
        ({"runtime": "singularity", "image": "-x.sif"}, None, "starts with '-', which singularity would read"),
        ({"runtime": "shifter", "image": "nersc/x:1 $(id)"}, None, "is not a registry reference"),
        ({"runtime": "podman", "image": "docker://a\tb"}, None, "is not a registry reference"),
        ({"runtime": "pyxis", "image": "x", "options": ["--x"]}, None, "container.options: pyxis takes srun's options"),
        # One word each, starting with '-': never a value the runtime would read as the image.
        # Started from the batch shell too (the image check): no node's or rank's value in its words.
        (
            {"runtime": "singularity", "image": "/x.sif", "mounts": ["/d/{rank}:/d"]},
            None,
            "container.mounts[0]: {rank}",
        ),
        ({"runtime": "docker", "image": "x", "workdir": "/w/{hostname}"}, None, "container.workdir: {hostname}"),
        ({"runtime": "docker", "image": "x", "options": ["--ulimit memlock=-1"]}, None, "container.options[0]"),
        ({"runtime": "docker", "image": "x", "options": ["evil:latest"]}, None, "container.options[0]"),
        ({"runtime": "docker", "image": "x", "options": ["--a\n--b"]}, None, "container.options[0]"),
        # Shifter stages the image before the job: no run-time value can be in it.
        ({"runtime": "shifter", "image": "{env:CONT}"}, None, "shifter stages its image before the job starts"),
        # The text around a run-time value is still checked.
        ({"runtime": "docker", "image": "{env:REG}/a b"}, None, "is not a registry reference"),
    ],
)
def test_what_a_runtime_cannot_do_is_refused_in_one_line(
    tmp_path: Path, container: dict, gpu: dict | None, message: str
) -> None:
    _profile(tmp_path, gpu, **container)
    recipe = {"resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"}} if gpu else {}
    refused = _refused(_recipe(tmp_path, **recipe))
    assert message in refused and re.match(r"^\S+:\d+: ", refused), refused


@pytest.mark.parametrize(
    "runtime, image",
    [
        ("pyxis", "{env:CONT}"),
        ("docker", "{env:CONT}"),
        ("singularity", "{env:CONT}"),
        ("singularity", "{env:IMAGES}/train.sif"),
        ("podman", "{env:IMAGES}/rootfs/"),
    ],
)
def test_an_image_that_is_a_run_time_value_validates_and_reaches_the_runtime_filled_in(
    tmp_path: Path, runtime: str, image: str
) -> None:
    """An image from the job's environment (MLPerf's $CONT) is known only on the node: what can be
    checked is the text around it; the word is marked for the job to fill in."""
    _profile(tmp_path, **{"runtime": runtime, "image": image})
    job = render_job(load_recipe(_recipe(tmp_path)))
    plan = plan_of(job).launch
    words = [*plan.argv, *plan.srun]
    holding = [word for word in words if image in word]
    assert holding, words
    assert all(words.index(word) in plan.expand or word in plan.srun for word in holding)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_a_container_outside_the_job_gets_no_per_task_gpu_binding_and_wants_whole_nodes(
    tmp_path: Path, runtime: str
) -> None:
    """SLURM's cgroup and srun's --gpu-bind (CUDA_VISIBLE_DEVICES by cgroup index) do not reach a
    container the docker daemon starts, or one given only the variables it names."""
    _profile(tmp_path, {"model": "G", "memory_gb": 80}, runtime=runtime, image="r/train:1")
    profile = tmp_path / "clusters" / "boxed.yaml"
    profile.write_text(profile.read_text() + "task_gpu_bind: single:1\n")
    resources = {"nodes": 2, "gpus_per_node": 2, "time": "5"}
    assert f"task_gpu_bind: SLURM's per-task GPU binding does not reach a {runtime} container" in _refused(
        _recipe(tmp_path, resources=resources)
    )
    _profile(tmp_path, {"model": "G", "memory_gb": 80}, runtime=runtime, image="r/train:1")
    done = run_cli("validate", str(_recipe(tmp_path, resources=resources)), cwd=tmp_path)
    assert done.returncode == 0 and f"warning: resources.exclusive: {runtime}'s containers run outside" in done.stderr
    done = run_cli("validate", str(_recipe(tmp_path, resources={**resources, "exclusive": True})), cwd=tmp_path)
    assert done.returncode == 0 and "outside SLURM's cgroup" not in done.stdout + done.stderr


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_the_preemption_signal_would_end_a_launcher_inside_a_docker_container(tmp_path: Path, runtime: str) -> None:
    """The node agent hands the signal only to processes that handle it (torchrun would end on it), but
    it cannot see into a container that a daemon or conmon started: the client proxies the signal to
    the container's first process, the launcher itself."""
    _profile(tmp_path, runtime=runtime, image="r/train:1")
    refused = _refused(_recipe(tmp_path, launcher="torchrun"))
    assert f"preemption.signal: {runtime} passes the preemption signal to the container's first process" in refused
    load_recipe(_recipe(tmp_path, launcher="torchrun", preemption={"signal": False}))
    load_recipe(_recipe(tmp_path, launcher="python"))  # each rank is the first process of its container
    _profile(tmp_path, runtime="singularity", image="/x.sif")  # in the job: the node agent sees the ranks
    load_recipe(_recipe(tmp_path, launcher="torchrun"))


def test_a_recipes_image_is_checked_against_the_profiles_runtime(tmp_path: Path) -> None:
    _profile(tmp_path, runtime="docker", image="nvcr.io/nvidia/pytorch:24.05-py3")
    refused = _refused(_recipe(tmp_path, container_image="/images/mine.sif"))
    assert "container_image: docker cannot run an image file (.sif, .sqsh) (/images/mine.sif)" in refused
    load_recipe(_recipe(tmp_path, container_image="docker://ghcr.io/me/mine:1"))


@pytest.mark.parametrize(
    "vendor, runtime, words",
    [
        ("nvidia", "docker", ["--gpus=all"]),
        ("amd", "docker", ["--device=/dev/kfd", "--device=/dev/dri", "--group-add=video"]),
        ("nvidia", "podman", ["--device=nvidia.com/gpu=all"]),
        ("amd", "podman", ["--device=/dev/kfd", "--device=/dev/dri", "--group-add=video"]),
        ("nvidia", "singularity", ["--nv"]),
        ("amd", "singularity", ["--rocm"]),
        ("nvidia", "shifter", ["--module=gpu"]),
    ],
)
def test_each_runtime_gets_the_gpus_its_own_way(tmp_path: Path, vendor: str, runtime: str, words: list[str]) -> None:
    _profile(tmp_path, {"model": "G", "memory_gb": 80, "vendor": vendor}, runtime=runtime, image="r/train:1")
    argv = plan_of(render_job(load_recipe(_recipe(tmp_path, resources={"nodes": 2, "gpus_per_node": 2, "time": "5"}))))
    argv = task_argv(argv.launch, "/r")
    assert all(word in argv for word in words)
    others = {"--nv", "--rocm", "--gpus=all", "--module=gpu", "--device=/dev/kfd", "--device=nvidia.com/gpu=all"}
    assert not (others - set(words)) & set(argv)
    _profile(tmp_path, runtime=runtime, image="r/train:1")  # a CPU profile: no GPU words at all
    assert not others & set(task_argv(plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch, "/r"))


def test_docker_runs_a_container_per_task_given_the_jobs_variables_by_name(tmp_path: Path) -> None:
    _profile(
        tmp_path,
        runtime="docker",
        image="docker://nvcr.io/nvidia/pytorch:24.05-py3",
        mounts=["/data", "/scratch:/scratch:rw"],
        options=["--device=/dev/infiniband"],
    )
    path = _recipe(tmp_path, env={"MY_SETTING": "a b; $(rm -rf ~)"}, secrets=["HF_TOKEN"])
    plan = plan_of(render_job(load_recipe(path)))
    argv = task_argv(plan.launch, "/r d", SLURM_PROCID="3")
    assert argv[:11] == [
        "docker",
        "run",
        "--rm",
        "--init",
        "--network=host",
        "--ipc=host",
        "--name=clusterkit-7-launch-3",
        f"--user={os.getuid()}:{os.getgid()}",
        "--volume=/data:/data",  # a bare path at its own path, not an anonymous volume
        "--volume=/scratch:/scratch:rw",
        "--volume=/r d:/r d",
    ]
    names = [word.removeprefix("--env=") for word in argv if word.startswith("--env=")]
    assert {"MY_SETTING", "HF_TOKEN", "RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURM_PROCID", "RUN_DIR"} <= set(names)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in names)  # names, never a value
    assert not any("rm -rf" in word for word in argv)
    at = argv.index("nvcr.io/nvidia/pytorch:24.05-py3")  # docker takes no docker:// prefix
    assert argv[at - 1] == "--device=/dev/infiniband" and argv[at + 1] == "python3"
    assert "--workdir=/r d" in argv


def test_the_image_check_runs_in_a_container_of_its_own_started_from_the_batch_shell(tmp_path: Path) -> None:
    """One task without the node agent: its words are filled in by the supervisor, which knows the
    job's values (the user's ids too) but no task's, so its container's name holds none."""
    _profile(tmp_path, runtime="docker", image="r/train:1")
    plan = plan_of(render_job(load_recipe(_recipe(tmp_path, launcher="torchrun", preemption={"signal": False}))))
    argv, _ = started(plan, plan.image_check, "/r")
    docker = argv[argv.index("docker") :]
    assert docker[6:8] == ["--name=clusterkit-7-image-check", f"--user={os.getuid()}:{os.getgid()}"]
    assert docker[-4:] == ["python3", "-c", IMAGE_CHECK, "torch"] and not any("{" in word for word in docker[:-3])


def test_every_variable_clusterkits_ranks_read_reaches_a_docker_container() -> None:
    """The runner, preflight and the stack-dump site folder read these from their environment; a docker
    container has only what it is given by name."""
    read = set()
    for source in [
        *(REPO / "clusterkit" / "runtime").glob("*.py"),
        *(REPO / "clusterkit" / "supervisor").rglob("*.py"),
    ]:
        read |= set(re.findall(r"environ(?:\.get\(|\[)\"([A-Z][A-Z0-9_]*)\"", source.read_text()))
    read -= {"CUDA_VISIBLE_DEVICES", "HF_HOME", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"}  # env.sh's when set
    read -= {"CLUSTERKIT_RAY_ADDRESS"}  # launcher: ray takes no container (load.ray_checks)
    read = {name for name in read if not name.startswith(("OMPI_", "PMI_", "MPI_"))}  # mpirun: no container yet
    assert read <= set(containers.PASSED_ENV), read - set(containers.PASSED_ENV)


def test_podman_maps_the_user_and_runs_a_sandbox_folder_as_its_root(tmp_path: Path) -> None:
    _profile(tmp_path, runtime="podman", image="/images/rootfs/")
    argv = task_argv(plan_of(render_job(load_recipe(_recipe(tmp_path)))).launch, "/r")
    assert "--userns=keep-id" in argv and not any(word.startswith("--user=") for word in argv)
    at = argv.index("--rootfs")
    assert argv[at + 1 : at + 3] == ["/images/rootfs/", "python3"]


def test_shifter_names_its_image_in_the_header_and_on_each_task(tmp_path: Path) -> None:
    _profile(tmp_path, runtime="shifter", image="docker://nvcr.io/nvidia/pytorch:24.05-py3", mounts=["/data:/in"])
    job = render_job(load_recipe(_recipe(tmp_path)))
    assert "#SBATCH --image=docker:nvcr.io/nvidia/pytorch:24.05-py3\n" in job.files["job.sbatch"]
    assert task_argv(plan_of(job).launch, "/r")[:5] == [
        "shifter",
        "--image=docker:nvcr.io/nvidia/pytorch:24.05-py3",
        "--volume=/data:/in",
        "--volume=/r:/r",
        "python3",
    ]
    _profile(tmp_path, runtime="singularity", image="/x.sif")
    assert "--image" not in render_job(load_recipe(_recipe(tmp_path))).files["job.sbatch"]


def test_an_image_of_a_program_without_python_is_not_checked_for_python(tmp_path: Path) -> None:
    for runtime in ("docker", "podman", "shifter", "singularity"):
        _profile(tmp_path, runtime=runtime, image="r/tool:1")
        path = _recipe(
            tmp_path, launcher="command", python="bash", task={"script": "/opt/bin/train"}, preemption={"signal": False}
        )
        assert plan_of(render_job(load_recipe(path))).image_check is None


def _job(tmp_path: Path, runtime: str, image: str, *executor: str) -> tuple[Path, list[dict]]:
    """A 2-node job of the echo_contract script (two ranks per node, one container each) through the
    stand-in ``runtime``, submitted with ``executor`` (none: SLURM); its run directory and the calls."""
    image = image.format(tmp=tmp_path)
    if runtime == "singularity":
        Path(image).write_bytes(b"stand-in image")
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    _profile(tmp_path, runtime=runtime, image=image, mounts=[str(data)])
    path = _recipe(tmp_path, env={"PATH": {"prepend": str(STANDIN)}, "MY_SETTING": "x y"})
    # A host variable no one passes: a docker/podman container must not see it.
    env = dict(os.environ, ONLY_ON_THE_HOST="1")
    done = run_cli("submit", str(path), *executor, "--follow", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "boxed").iterdir())
    calls = [json.loads(line) for line in (run_dir / "container-calls.jsonl").read_text().splitlines()]
    return run_dir, calls


def _expected_argv(plan_argv: tuple[str, ...], expand_at: tuple[int, ...], run_dir: Path, argv: list[str]) -> list[str]:
    """The plan's words with this task's run-time values (a docker/podman container's name holds its
    srun task id, read back from the call)."""
    name = next((word for word in argv if word.startswith("--name=")), "-")
    values = {"job_id": run_dir.name, "run_dir": str(run_dir), "rank": name.rsplit("-", 1)[1]}
    values.update(uid=str(os.getuid()), gid=str(os.getgid()))
    return [expand(word, values) if index in expand_at else word for index, word in enumerate(plan_argv)]


def _assert_each_rank_ran_through(runtime: str, run_dir: Path, calls: list[dict], nodes: set[str]) -> None:
    """Every rank started through the runtime with exactly the argv of its plan, the run directory
    mounted at its own path, and ran; docker/podman ranks saw only the variables passed by name."""
    launch = plan_of(render_job(load_recipe(run_dir.parents[2] / "boxed.yaml"))).launch
    assert len(calls) == 4 and {call["runtime"] for call in calls} == {runtime}  # no image check: nothing imported
    for call in calls:
        assert [runtime, *call["argv"]] == _expected_argv(launch.argv, launch.expand, run_dir, call["argv"])
        # The script from the code snapshot in the run directory, which is mounted at its own path.
        assert call["command"] == ["python3", f"{run_dir}/code/tests/scripts/echo_contract.py"]
        argv = call["argv"]
        mounted = (
            [argv[at + 1] for at, word in enumerate(argv) if word == "--bind"] if runtime == "singularity" else argv
        )
        assert (str(run_dir) if runtime == "singularity" else f"--volume={run_dir}:{run_dir}") in mounted
    if runtime in ("docker", "podman"):
        names = sorted(word for call in calls for word in call["argv"] if word.startswith("--name="))
        assert names == [f"--name=clusterkit-{run_dir.name}-launch-{rank}" for rank in range(4)]
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3]
    assert {r["node"] for r in ranks} == nodes
    assert all(r["env"]["MY_SETTING"] == "x y" for r in ranks)
    host_only = {"ONLY_ON_THE_HOST" in r["env"] for r in ranks}
    assert host_only == ({False} if runtime in ("docker", "podman") else {True})


RUNS = [
    ("singularity", "{tmp}/train.sif"),
    ("docker", "ghcr.io/me/train:1"),
    ("podman", "docker://ghcr.io/me/train:1"),
    ("shifter", "me/train:1"),
]


@pytest.mark.parametrize("runtime, image", RUNS)
def test_a_two_node_job_runs_each_rank_through_the_runtime(tmp_path: Path, runtime: str, image: str) -> None:
    """Under the local executor, through the stand-in (see the module's docstring)."""
    run_dir, calls = _job(tmp_path, runtime, image, "--executor", "local")
    _assert_each_rank_ran_through(runtime, run_dir, calls, {"127.0.0.1", "127.0.0.2"})


@pytest.mark.slurm
@pytest.mark.parametrize("runtime, image", RUNS)
def test_a_two_node_job_runs_each_rank_through_the_runtime_on_the_dev_cluster(
    dev_cluster: str, tmp_path: Path, runtime: str, image: str
) -> None:
    """The same job on the dev cluster's two nodes, through the same stand-in: srun's tasks, SLURM's
    variables and the node agent are the real ones."""
    run_dir, calls = _job(tmp_path, runtime, image)
    _assert_each_rank_ran_through(runtime, run_dir, calls, {"node1", "node2"})


HOSTILE = ["a b", "$(touch /tmp/ck-canary)", "x;y", "'q'", "-x", "p\n", "{rank}", "~", "%j", "a,b", "\x1b[31m", "*"]


@pytest.mark.parametrize("runtime", ["docker", "podman", "shifter", "singularity"])
@pytest.mark.parametrize("key", ["image", "mounts", "workdir", "options"])
def test_a_hostile_container_value_is_refused_in_one_line_or_passed_as_one_word(
    tmp_path: Path, runtime: str, key: str
) -> None:
    """Each value either stops at validate (one line per finding), or reaches the runtime in one argv word,
    exactly as written (no shell; a run-time value such as {rank} filled in on the node, as in task
    args, and nothing else), and the script stays bash."""
    for value in HOSTILE:
        as_written = f"/{value}" if key == "mounts" else value
        container = {"runtime": runtime, "image": "/x.sif" if runtime == "singularity" else "r/train:1"}
        container[key] = [as_written] if key in ("mounts", "options") else as_written
        _profile(tmp_path, **container)
        try:
            job = render_job(load_recipe(_recipe(tmp_path)))
        except RecipeError as refused:
            lines = str(refused).splitlines()  # one line per finding, each naming the key
            assert all(line.isprintable() and f": container.{key}" in line for line in lines), (key, value, lines)
            continue
        argv, expand_at = plan_of(job).launch.argv, plan_of(job).launch.expand
        # (the container's name is clusterkit's own word, with its own run-time values)
        holding = [at for at, word in enumerate(argv) if as_written in word and not word.startswith("--name=")]
        filled_in = bool(placeholders(as_written))
        assert holding and all((at in expand_at) == filled_in for at in holding), (key, value, argv)
        script = tmp_path / "job.sbatch"
        script.write_text(job.files["job.sbatch"])
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client installed")
@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_the_real_docker_client_parses_every_option_clusterkit_writes(tmp_path: Path, vendor: str) -> None:
    """No daemon here, but the docker client parses (and checks the values of) its options before it
    connects: each word of the launch and the image check gets past that, to the daemon (whose address
    points nowhere, so no container can start even where a daemon runs). 'unknown flag' or 'invalid
    argument' would be a word clusterkit writes wrong."""
    gpu = {"model": "G", "memory_gb": 80, "vendor": vendor}
    _profile(
        tmp_path, gpu, runtime="docker", image="r/train:1", mounts=["/data:/data:ro"], options=["--ulimit=memlock=-1"]
    )
    recipe = _recipe(
        tmp_path,
        launcher="torchrun",
        preemption={"signal": False},
        resources={"nodes": 2, "gpus_per_node": 2, "time": "5", "exclusive": True},
    )
    plan = plan_of(render_job(load_recipe(recipe)))
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/clusterkit-test/docker.sock")
    for step in (plan.launch, plan.image_check):
        argv, _ = started(plan, step, "/r") if step is plan.image_check else (task_argv(step, "/r"), None)
        argv = [word.replace("{uid}", "0").replace("{gid}", "0") for word in argv[argv.index("docker") :]]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        # ("unknown server OS": --gpus asks the daemon what it runs on, once the options are parsed)
        reached = "Cannot connect to the Docker daemon" in done.stderr or "unknown server OS" in done.stderr
        assert done.returncode != 0 and reached and "invalid" not in done.stderr, (step.name, done.stderr)

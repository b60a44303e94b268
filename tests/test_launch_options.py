"""What real launch scripts say, said in a recipe (issue 13, first part): env edits and unsets, setup
after the environment and outside `set -u`, pre-launch and post-run hooks, options of the launch
step's srun, and extra_sbatch checked against sbatch's own options. Rendered and linted here, run in
bash where that decides it, and end to end on the dev cluster."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.render.job import sbatch_options
from clusterkit.supervisor.ranks import task_ids
from conftest import REPO, run_cli
from launch_plans import command, plan_of, started, task_argv

SCRIPT = str(REPO / "tests" / "scripts" / "echo_contract.py")
SNAPSHOT_SCRIPT = (
    "{run_dir}/code/tests/scripts/echo_contract.py"  # where the job runs it: the code snapshot (git tree REPO)
)


def _recipe(tmp_path: Path, **fields) -> Path:
    body = {
        "name": "opts",
        "cluster": "dev",
        "resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"},
        "task": {"script": SCRIPT},
        **fields,
    }
    path = tmp_path / "opts.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _env_after(env_sh: str, inherited: dict[str, str], *names: str) -> dict[str, str | None]:
    """Source the rendered env.sh in bash with ``inherited`` and read ``names`` back (None: unset)."""
    probe = "".join(f'if [ -n "${{{n}+x}}" ]; then printf "%s=%s\\0" {n} "${n}"; fi; ' for n in names)
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source /dev/stdin <<'EOF_ENV'\n{env_sh}EOF_ENV\n{probe}"],
        env={"PATH": os.environ["PATH"], **inherited},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = dict(item.split("=", 1) for item in done.stdout.split("\0") if item)
    return {name: seen.get(name) for name in names}


@pytest.mark.parametrize(
    "inherited, expected",
    [
        ({"LD_LIBRARY_PATH": "/inherited/lib"}, "/opt/a b/lib:/inherited/lib:/tail"),
        ({"LD_LIBRARY_PATH": ""}, "/opt/a b/lib:/tail"),
        ({}, "/opt/a b/lib:/tail"),
    ],
)
def test_an_env_edit_extends_the_inherited_value(tmp_path: Path, inherited: dict[str, str], expected: str) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path,
            env={
                "LD_LIBRARY_PATH": {"prepend": "/opt/a b/lib", "append": "/tail"},
                "GONE": None,
                "KEPT": "$HOME 'quoted'",
            },
        )
    )
    env_sh = render_job(loaded).files["env.sh"]
    seen = _env_after(env_sh, {**inherited, "GONE": "x"}, "LD_LIBRARY_PATH", "GONE", "KEPT")
    assert seen == {"LD_LIBRARY_PATH": expected, "GONE": None, "KEPT": "$HOME 'quoted'"}


def test_edits_from_the_profile_and_the_recipe_both_apply_and_null_unsets_a_profile_value(tmp_path: Path) -> None:
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    dev = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    dev["env"] = {"LD_LIBRARY_PATH": {"prepend": "/site/lib"}, "SITE_ONLY": "1", "SITE_FLAG": "on"}
    (clusters / "dev.yaml").write_text(yaml.safe_dump(dev))
    loaded = load_recipe(_recipe(tmp_path, env={"LD_LIBRARY_PATH": {"prepend": "/recipe/lib"}, "SITE_FLAG": None}))
    seen = _env_after(
        render_job(loaded).files["env.sh"], {"LD_LIBRARY_PATH": "/base"}, "LD_LIBRARY_PATH", "SITE_ONLY", "SITE_FLAG"
    )
    assert seen == {"LD_LIBRARY_PATH": "/recipe/lib:/site/lib:/base", "SITE_ONLY": "1", "SITE_FLAG": None}


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "env:\n  FOO:\n",
            "env.FOO: an environment value cannot be empty; write '' for an empty value, or null to unset",
        ),
        ("env:\n  FOO: {prepend: ''x}\n", None),
        ("env:\n  FOO: {prefix: /x}\n", "env.FOO"),
    ],
)
def test_bad_env_entries_are_one_line_each(tmp_path: Path, text: str, message: str | None) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\ncluster: dev\ntask: {{script: {SCRIPT}}}\n{text}")
    with pytest.raises(RecipeError) as raised:
        load_recipe(path)
    assert str(raised.value).count("\n") == 0 and str(raised.value).startswith(f"{path}:")
    if message:
        assert message in str(raised.value)


def test_an_env_edit_keeps_the_text_written(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\ncluster: dev\ntask: {{script: {SCRIPT}}}\nenv:\n  V: {{append: 3.10, prepend: yes}}\n")
    seen = _env_after(render_job(load_recipe(path)).files["env.sh"], {"V": "mid"}, "V")
    assert seen == {"V": "yes:mid:3.10"}


@pytest.mark.parametrize(
    "flag, fragment",
    [
        ("mpi", "srun option, not an sbatch one; set it for the launch step under srun.mpi"),
        ("label", "under srun.label"),
        ("kill-on-bad-exit", "under srun.kill_on_bad_exit"),
        ("multi-prog", "under srun.extra"),
    ],
)
def test_srun_only_flags_in_extra_sbatch_point_to_srun(tmp_path: Path, flag: str, fragment: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, resources={"nodes": 1, "extra_sbatch": {flag: True}}))
    assert f"resources.extra_sbatch.{flag}: --{flag} is an" in str(raised.value) and fragment in str(raised.value)


def test_an_option_sbatch_does_not_document_is_a_warning_and_a_documented_one_is_fine(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path, resources={"nodes": 1, "time": "5", "extra_sbatch": {"container-image": "x", "mail-type": "END"}}
        )
    )
    warnings = [str(w) for w in loaded.warnings]
    assert (
        len(warnings) == 1 and "extra_sbatch.container-image: --container-image is not an sbatch option" in warnings[0]
    )
    assert ("mail-type", "END") in sbatch_options(loaded)


@pytest.mark.parametrize(
    "flag, field",
    [
        ("cpus-per-task", "resources.cpus_per_task"),
        ("ntasks", "resources.nodes"),
        ("out", "runs_dir"),
        ("mpi", "srun.mpi"),
        ("kill-on-bad-exit", "srun.kill_on_bad_exit"),
    ],
)
def test_options_the_launch_step_owns_are_refused_in_srun_extra(tmp_path: Path, flag: str, field: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, srun={"extra": {flag: "x"}}))
    assert f"srun.extra.{flag}: --{flag} is given to the launch step by clusterkit; set {field}" in str(raised.value)


def test_the_launch_step_gets_its_options_and_cpus_per_task(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path,
            srun={
                "label": True,
                "mpi": "pmix",
                "wait": 30,
                "kill_on_bad_exit": False,
                "distribution": "block:cyclic",
                "cpu_bind": "none",
                "extra": {"container-image": "img:1 2", "no-kill": True, "overlap": False},
            },
        )
    )
    plan = plan_of(render_job(loaded))
    argv, _ = started(plan, plan.launch, "/runs/9")
    assert argv[: argv.index("--open-mode=append")] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=node1,node2",
        "--kill-on-bad-exit=0",
        "--cpus-per-task=2",
        "--wait=30",
        "--mpi=pmix",
        "--distribution=block:cyclic",
        "--cpu-bind=none",
        "--label",
        "--container-image=img:1 2",
        "--no-kill",
    ]


def test_uneven_pipeline_stages_are_a_warning(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path,
            resources={"nodes": 2, "gpus_per_node": 2},
            parallelism={"pp": 2},
            task={
                "script": SCRIPT,
                "model_config": {"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 64},
            },
        )
    )
    assert any(
        "3 layers do not divide evenly into pp=2 stages: the stages get 1 or 2 layers" in str(w)
        for w in loaded.warnings
    )


@pytest.mark.slurm
def test_hooks_env_setup_and_srun_options_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    """One job, rank 3 failing: the post-run hook sees the launchers' exit code and cannot change the
    job's; a prepended LD_LIBRARY_PATH keeps the inherited entries; a setup line reading an unset
    variable runs; the launch step labels its output and passes --cpus-per-task to every task."""
    recipe = _recipe(
        tmp_path,
        runs_dir=str(tmp_path / "runs"),
        env={
            "ENV_CONTRACT_INIT_PROCESS_GROUP": 1,
            "ENV_CONTRACT_FAIL_RANK": 3,
            "LD_LIBRARY_PATH": {"prepend": "/opt/ck test/lib"},
            "CK_DROPPED": None,
        },
        setup=["export CK_SETUP=/setup:$CK_NEVER_SET"],
        hooks={
            "pre_launch": ['echo "pre $SLURM_JOB_ID" > "$RUN_DIR/pre_launch.txt"'],
            "post_run": ['echo "$CLUSTERKIT_EXIT_CODE" > "$RUN_DIR/post_run.txt"', "exit 7"],
        },
        srun={"label": True},
    )
    env = {**os.environ, "LD_LIBRARY_PATH": "/inherited/lib", "CK_DROPPED": "present"}
    done = run_cli("submit", str(recipe), "--follow", cwd=REPO, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("run dir: ")))
    job_id = run_dir.name
    launchers_rc = (run_dir / "exit_code").read_text().strip()
    assert launchers_rc not in ("0", "7")
    assert (run_dir / "post_run.txt").read_text().strip() == launchers_rc  # the hook saw it; exit 7 changed nothing
    assert (run_dir / "pre_launch.txt").read_text() == f"pre {job_id}\n"
    status = run_cli("status", job_id, "--runs-dir", str(tmp_path / "runs"), "--json")
    assert json.loads(status.stdout)["state"] == "FAILED"
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3]  # all four ran (and joined one all-reduce)
    assert {r["node"] for r in ranks} == {"node1", "node2"}
    for seen in ranks:
        assert seen["env"]["LD_LIBRARY_PATH"] == "/opt/ck test/lib:/inherited/lib"
        assert "CK_DROPPED" not in seen["env"] and seen["env"]["CK_SETUP"] == "/setup:"
        assert seen["env"]["SLURM_CPUS_PER_TASK"] == "2"
    node1_log = (run_dir / f"{job_id}_1_log.out").read_text()
    assert node1_log and all(line.startswith("1: ") for line in node1_log.splitlines() if line.strip())


# --- process models ---------------------------------------------------------------------------------


def test_the_python_launcher_runs_a_task_per_gpu_with_the_ranks_mapped_from_slurm(tmp_path: Path) -> None:
    loaded = load_recipe(_recipe(tmp_path, launcher="python"))
    recipe = loaded.recipe
    assert (recipe.process_model, recipe.tasks_per_node, recipe.resources.cpus_per_task) == ("task_per_gpu", 2, 1)
    files = render_job(loaded).files
    assert ("ntasks-per-node", 2) in sbatch_options(loaded) and ("cpus-per-task", 1) in sbatch_options(loaded)
    launch = plan_of(render_job(loaded)).launch
    assert (launch.nodes, launch.ntasks, launch.tasks_per_node, launch.srun) == (
        2,
        4,
        2,
        ("--kill-on-bad-exit=1", "--cpus-per-task=1"),
    )
    # srun is the launcher: the node agent maps each task's ids, and the rank starts with the
    # preemption signal at its default (so a framework can install its own handler).
    assert launch.env == {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"} and launch.ranks == "task"
    assert launch.signal_to_launcher and launch.argv[0] == "python3"
    assert "export OMP_NUM_THREADS=1\n" in files["env.sh"]


@pytest.mark.parametrize(
    "launcher, cpus, needed",
    [
        ("python", 2, "2 CPUs per srun task x 2 tasks per node (task_per_gpu) needs 4"),
        ("torchrun", 3, "3 CPUs per srun task (one launcher task per node) needs 3"),
    ],
)
def test_cpus_that_do_not_fit_a_node_are_refused_before_anything_is_queued(
    tmp_path: Path, launcher: str, cpus: int, needed: str
) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, launcher=launcher, resources={"nodes": 2, "time": "5", "cpus_per_task": cpus}))
    assert f"resources.cpus_per_task: {needed} CPUs per node; cluster profile 'dev' has 2" in str(raised.value)


def test_a_process_model_the_launcher_does_not_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, launcher="torchrun", process_model="task_per_gpu"))
    assert (
        "process_model: task_per_gpu is not how launcher torchrun starts ranks (launcher_per_node); "
        "for task_per_gpu use launcher: python"
    ) in str(raised.value)


def test_a_task_per_gpu_job_runs_on_the_local_executor(tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path, launcher="python", runs_dir=str(tmp_path / "runs"), env={"ENV_CONTRACT_INIT_PROCESS_GROUP": 1}
    )
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "opts").iterdir())
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    seen = sorted((r["env"]["RANK"], r["env"]["LOCAL_RANK"], r["env"]["NODE_RANK"], r["node"]) for r in ranks)
    assert seen == [
        ("0", "0", "0", "127.0.0.1"),
        ("1", "1", "0", "127.0.0.1"),
        ("2", "0", "1", "127.0.0.2"),
        ("3", "1", "1", "127.0.0.2"),
    ]
    assert {
        (r["env"]["WORLD_SIZE"], r["env"]["LOCAL_WORLD_SIZE"], r["env"]["SLURM_PROCID"] == r["env"]["RANK"])
        for r in ranks
    } == {("4", "2", True)}
    logs = run_cli("logs", run_dir.name, "--rank", "3", "--runs-dir", str(tmp_path / "runs"))
    assert logs.returncode == 0 and logs.stdout == f"==> {run_dir.name}_3_log.out <==\necho_contract: rank 3 of 4\n"


# --- run-time values ----------------------------------------------------------------------------------

RUNTIME_ENV = {
    "TAG": "j{job_id} n{node_rank} r{rank} l{local_rank} ${HOME} {x}",
    "OUT": {"prepend": "{run_dir}/n{node_rank}"},
}
RUNTIME_ARGS = ["{run_dir}/out-{node_rank}-{rank}", "'{local_rank}' $HOME"]


def _assert_runtime_values(run_dir: Path) -> None:
    """Each of the four tasks got its own node, rank and local rank; other braces stayed as written."""
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert len(ranks) == 4
    for seen in ranks:
        env = seen["env"]
        node, rank, local = env["SLURM_NODEID"], env["RANK"], env["LOCAL_RANK"]
        assert env["TAG"] == f"j{run_dir.name} n{node} r{rank} l{local} ${{HOME}} {{x}}"
        assert env["OUT"].split(":")[0] == f"{run_dir}/n{node}"
        assert seen["argv"] == [f"{run_dir}/out-{node}-{rank}", f"'{local}' $HOME"]


def test_run_time_values_resolve_per_node_under_torchrun(tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        runs_dir=str(tmp_path / "runs"),
        env=RUNTIME_ENV,
        task={"script": SCRIPT, "args": ["{run_dir}/out-{node_rank}-{rank}"]},
    )
    with pytest.raises(RecipeError, match=r"task\.args\[0\]: \{rank\} is known only in a task per rank"):
        load_recipe(recipe)
    env = {**RUNTIME_ENV, "TAG": "j{job_id} n{node_rank} r{x} l{local_rank} ${HOME} {x}"}  # {local_rank}: refused too
    with pytest.raises(RecipeError, match=r"env\.TAG: \{local_rank\} is known only"):
        load_recipe(_recipe(tmp_path, env=env))
    recipe = _recipe(
        tmp_path,
        runs_dir=str(tmp_path / "runs"),
        env={"TAG": "j{job_id} n{node_rank}", "OUT": RUNTIME_ENV["OUT"]},
        task={"script": SCRIPT, "args": ["{run_dir}/out-{node_rank}", "{job_id}"]},
    )
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "opts").iterdir())
    for seen in [json.loads(p.read_text()) for p in (run_dir / "contract").glob("rank-*.json")]:
        node = seen["env"]["SLURM_NODEID"]
        assert seen["env"]["TAG"] == f"j{run_dir.name} n{node}" and seen["env"]["OUT"].startswith(f"{run_dir}/n{node}")
        assert seen["argv"] == [f"{run_dir}/out-{node}", run_dir.name]


def test_run_time_values_resolve_per_task_for_a_task_per_gpu_job(tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        launcher="python",
        runs_dir=str(tmp_path / "runs"),
        env=RUNTIME_ENV,
        task={"script": SCRIPT, "args": RUNTIME_ARGS},
    )
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_runtime_values(next((tmp_path / "runs" / "opts").iterdir()))


@pytest.mark.slurm
def test_run_time_values_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    recipe = _recipe(
        tmp_path,
        launcher="python",
        runs_dir=str(tmp_path / "runs"),
        env=RUNTIME_ENV,
        task={"script": SCRIPT, "args": RUNTIME_ARGS},
    )
    done = run_cli("submit", str(recipe), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "opts").iterdir())
    _assert_runtime_values(run_dir)
    assert {json.loads(p.read_text())["node"] for p in (run_dir / "contract").glob("rank-*.json")} == {"node1", "node2"}


# --- launchers: arguments, rendezvous, your own command ------------------------------------------


def test_launcher_args_reach_torchrun_and_deepspeed_quoted(tmp_path: Path) -> None:
    args = ["--max-restarts=2", "--role", "trainer one", "--redirects", "3"]
    torchrun = plan_of(render_job(load_recipe(_recipe(tmp_path, launcher_args=args)))).launch
    at = torchrun.argv.index("--max-restarts=2")
    assert list(torchrun.argv[at : at + 6]) == [*args, SNAPSHOT_SCRIPT]
    ds = plan_of(
        render_job(load_recipe(_recipe(tmp_path, launcher="deepspeed", launcher_args=["--autotuning", "run"])))
    ).launch
    assert list(ds.argv[-3:]) == ["--autotuning", "run", SNAPSHOT_SCRIPT]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate"])
def test_launcher_args_take_a_nodes_run_time_values(tmp_path: Path, launcher: str) -> None:
    """{hostname} and {node_rank} in launcher_args are filled in on each node (torchrun --role, a
    per-node log name); other braces stay as written."""
    args = ["--role=trainer-{hostname}", "--x={node_rank}-{x}"]
    step = plan_of(render_job(load_recipe(_recipe(tmp_path, launcher=launcher, launcher_args=args)))).launch
    argv = task_argv(step, "/runs/r1")
    at = argv.index("--role=trainer-node2")
    assert argv[at : at + 2] == ["--role=trainer-node2", "--x=1-{x}"]


@pytest.mark.parametrize("value", ["{rank}", "{local_rank}"])
def test_a_ranks_run_time_value_in_launcher_args_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(RecipeError, match=rf"launcher_args\[1\]: \{{{value[1:-1]}\}} is known only in a task per rank"):
        load_recipe(_recipe(tmp_path, launcher_args=["--role", f"r{value}"]))
    with pytest.raises(RecipeError, match=r"launcher_args\[0\]: \{hostname\} is known only"):
        load_recipe(_recipe(tmp_path, launcher="mpirun", launcher_args=["--tag={hostname}"]))


def test_torchrun_role_per_node_reaches_the_ranks(tmp_path: Path) -> None:
    """Real processes: torchrun's --role from launcher_args, with each node's own hostname in it,
    is the ROLE_NAME its ranks see."""
    recipe = _recipe(tmp_path, runs_dir=str(tmp_path / "runs"), launcher_args=["--role=t-{hostname}-{node_rank}"])
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "opts").iterdir())
    seen = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert len(seen) == 4
    for rank in seen:
        env = rank["env"]
        assert env["ROLE_NAME"] == f"t-{env['SLURMD_NODENAME']}-{env['GROUP_RANK']}", env["ROLE_NAME"]
    assert {rank["env"]["ROLE_NAME"] for rank in seen} == {"t-127.0.0.1-0", "t-127.0.0.2-1"}


@pytest.mark.parametrize(
    "launcher, word, field",
    [
        ("torchrun", "--nnodes=3", "resources.nodes"),
        ("torchrun", "--nproc_per_node", "resources.gpus_per_node"),
        ("torchrun", "--rdzv-backend=etcd", "rendezvous"),
        ("torchrun", "--master", "the launch step"),
        ("torchrun", "-m", "task.module"),
        ("deepspeed", "--num_gpus=8", "resources.gpus_per_node"),
        ("deepspeed", "--launcher=slurm", "launcher (DeepSpeed runs here as one launcher per node)"),
        ("deepspeed", "--include", "deepspeed.include"),
    ],
)
def test_launcher_flags_clusterkit_writes_are_refused(tmp_path: Path, launcher: str, word: str, field: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, launcher=launcher, launcher_args=["--tee", "3", word]))
    assert f"launcher_args[2]: {word.split('=')[0]} is written by clusterkit for {launcher}; set {field}" in str(
        raised.value
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"launcher": "python", "launcher_args": ["-u"]},
            "launcher_args: launcher python takes no launcher_args; use python: [python3, ...]",
        ),
        (
            {"launcher": "command", "launcher_args": ["-x"]},
            "launcher_args: launcher command takes no launcher_args; use task.args",
        ),
        (
            {"launcher": "deepspeed", "rendezvous": "c10d"},
            "rendezvous: rendezvous: c10d is torchrun's; launcher deepspeed has none",
        ),
        (
            {"launcher": "command", "task": {"script": "run.sh", "module": True}},
            "task.module: launcher: command runs task.script as a program",
        ),
    ],
)
def test_launcher_settings_that_do_not_apply_are_refused(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **fields))
    assert message in str(raised.value)


def test_c10d_rendezvous_replaces_the_static_master_flags(tmp_path: Path) -> None:
    launch = plan_of(render_job(load_recipe(_recipe(tmp_path, rendezvous="c10d")))).launch
    assert "--rdzv-backend=c10d --rdzv-endpoint={master_addr}:{master_port} --rdzv-id={job_id} --tee=3" in command(
        launch
    )
    assert "--master-addr=" not in command(launch)
    assert "--rdzv-endpoint=node1:12345" in task_argv(launch, "/r") and "--rdzv-id=7" in task_argv(launch, "/r")


# The command launcher's contract, used the way a hand-written script would: its own torchrun line.
OWN_TORCHRUN = (
    'exec python3 -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$GPUS_PER_NODE" '
    '--node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" "$0"'
)


def _command_recipe(tmp_path: Path) -> Path:
    return _recipe(
        tmp_path,
        launcher="command",
        runs_dir=str(tmp_path / "runs"),
        env={"ENV_CONTRACT_INIT_PROCESS_GROUP": 1},
        task={"script": "bash", "args": ["-c", OWN_TORCHRUN, SCRIPT]},
    )


def _assert_command_ran(run_dir: Path, nodes: set[str]) -> None:
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert sorted(int(r["env"]["RANK"]) for r in ranks) == [0, 1, 2, 3]  # and they joined one all-reduce
    assert {r["node"] for r in ranks} == nodes
    assert {(r["env"]["NNODES"], r["env"]["GPUS_PER_NODE"], r["env"]["WORLD_SIZE"]) for r in ranks} == {("2", "2", "4")}
    assert {r["env"]["NODE_RANK"] == r["env"]["SLURM_NODEID"] for r in ranks} == {True}


def test_the_command_launcher_runs_your_command_once_per_node_locally(tmp_path: Path) -> None:
    done = run_cli("submit", str(_command_recipe(tmp_path)), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_command_ran(next((tmp_path / "runs" / "opts").iterdir()), {"127.0.0.1", "127.0.0.2"})


@pytest.mark.slurm
def test_the_command_launcher_on_the_dev_cluster(dev_cluster: str, tmp_path: Path) -> None:
    done = run_cli("submit", str(_command_recipe(tmp_path)), "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    _assert_command_ran(next((tmp_path / "runs" / "opts").iterdir()), {"node1", "node2"})


# --- accelerate launch ------------------------------------------------------------------------------


def test_accelerate_gets_the_layout_on_its_command_line_and_a_rendered_config(tmp_path: Path) -> None:
    loaded = load_recipe(REPO / "recipes" / "tiny-gpt2-cpu.yaml", ["launcher=accelerate"])
    files = render_job(loaded).files
    config = yaml.safe_load(files["accelerate_config.yaml"])
    assert (config["distributed_type"], config["num_machines"], config["num_processes"], config["mixed_precision"]) == (
        "MULTI_GPU",
        2,
        4,
        "no",
    )
    launch = plan_of(render_job(loaded)).launch
    assert "-m accelerate.commands.launch --machine_rank={node_rank}" in command(launch)
    assert (
        "--multi_gpu --num_machines=2 --num_processes=4 --same_network --rdzv_backend=static "
        "--main_process_ip={master_addr} --main_process_port={master_port}"
    ) in command(launch)
    assert "--config_file=/r/accelerate_config.yaml" in task_argv(launch, "/r")
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: MULTI_GPU\n")
    mine = render_job(
        load_recipe(REPO / "recipes" / "tiny-gpt2-cpu.yaml", ["launcher=accelerate", f"accelerate.config={own}"])
    )
    assert "accelerate_config.yaml" not in mine.files and f"--config_file={own}" in plan_of(mine).launch.argv


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 3}\n",
            "distributed_type DEEPSPEED contradicts the recipe's layout (MULTI_GPU: the built-in runner starts "
            "DeepSpeed or FSDP itself",
        ),
        ("distributed_type: FSDP\n", "distributed_type FSDP contradicts the recipe's layout"),
        (None, "cannot read the accelerate config"),
        ("a: [1\n", "cannot read the accelerate config"),
    ],
)
def test_an_accelerate_config_asking_for_what_would_silently_not_run_is_refused(
    tmp_path: Path, text: str | None, message: str
) -> None:
    """Found porting public scripts: with --multi_gpu, accelerate ignores the config's distributed_type;
    the built-in runner's DeepSpeed and FSDP are its own (tests/test_accelerate_layouts.py: a script's)."""
    own = tmp_path / "acc.yaml"
    if text is not None:
        own.write_text(text)
    with pytest.raises(RecipeError) as raised:
        load_recipe(REPO / "recipes" / "tiny-gpt2-cpu.yaml", ["launcher=accelerate", f"accelerate.config={own}"])
    assert "accelerate.config: " in str(raised.value) and message in str(raised.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["launcher=accelerate", "parallelism.zero_stage=2"],
            "parallelism.zero_stage: the built-in runner starts ZeRO itself, not under accelerate's DEEPSPEED type",
        ),
        (
            ["launcher=accelerate", "launcher_args=[--num_processes=8]"],
            "launcher_args[0]: --num_processes is written by clusterkit for accelerate",
        ),
        (["launcher=accelerate", "launcher_args=[--mixed_precision, fp16]"], "set precision instead"),
        (
            ["accelerate.config=x.yaml"],
            "accelerate.config: accelerate.config is read by launcher: accelerate, not by torchrun",
        ),
    ],
)
def test_accelerate_settings_that_cannot_apply_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(REPO / "recipes" / "tiny-gpt2-cpu.yaml", overrides)
    assert message in str(raised.value)


def test_no_requeues_and_no_retries_say_no_requeue(tmp_path: Path) -> None:
    """Found porting public scripts: max_requeues: 0 used to keep #SBATCH --requeue, with no way out."""
    never = sbatch_options(load_recipe(_recipe(tmp_path, preemption={"max_requeues": 0})))
    assert ("no-requeue", None) in never and ("requeue", None) not in never
    # A retry is a new job (excluding the failing node), so retries alone need no --requeue either.
    assert ("no-requeue", None) in sbatch_options(
        load_recipe(_recipe(tmp_path, preemption={"max_requeues": 0, "max_retries": 1}))
    )


def test_a_task_per_gpu_job_may_bind_one_gpu_per_task(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(tmp_path, launcher="python", resources={"nodes": 2, "time": "5", "extra_sbatch": {"gpus-per-task": 1}})
    )
    assert ("gpus-per-task", 1) in sbatch_options(loaded)
    with pytest.raises(RecipeError, match="binds one GPU to each task: gpus-per-task must be 1"):
        load_recipe(
            _recipe(
                tmp_path, launcher="python", resources={"nodes": 2, "time": "5", "extra_sbatch": {"gpus-per-task": 2}}
            )
        )
    with pytest.raises(RecipeError, match="one launcher task per node .* gpus-per-task must be 2, or leave it out"):
        load_recipe(_recipe(tmp_path, resources={"nodes": 2, "time": "5", "extra_sbatch": {"gpus-per-task": 1}}))


def _gpu_profile(tmp_path: Path, **fields) -> str:
    """The dev cluster as a GPU site: its nodes have two stand-in GPUs each (bin/dev-cluster: GRES on
    character devices, so SLURM's own binding runs; nothing computes on them)."""
    clusters = tmp_path / "clusters"
    clusters.mkdir(exist_ok=True)
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    profile.update(
        {"name": "devgpus", "accelerator": "gpu", "gpu_request": "gres", "task_gpu_bind": "single:1", **fields}
    )
    (clusters / "devgpus.yaml").write_text(yaml.safe_dump(profile))
    return "devgpus"


def test_the_profiles_gpu_binding_goes_only_to_a_step_of_one_task_per_rank(tmp_path: Path) -> None:
    cluster = _gpu_profile(tmp_path)
    python = plan_of(render_job(load_recipe(_recipe(tmp_path, cluster=cluster, launcher="python")))).launch
    assert python.srun == ("--kill-on-bad-exit=1", "--cpus-per-task=1", "--gpu-bind=single:1")
    batch = plan_of(
        render_job(
            load_recipe(_recipe(tmp_path, cluster=cluster, launcher="deepspeed", process_model="batch_launcher"))
        )
    ).launch
    assert "--gpu-bind=single:1" in batch.srun  # DeepSpeed's own srun starts a task per rank
    for whole_node in ({"launcher": "torchrun"}, {"launcher": "deepspeed"}, {"launcher": "mpirun"}):
        plan = plan_of(render_job(load_recipe(_recipe(tmp_path, cluster=cluster, **whole_node))))
        assert "gpu-bind" not in " ".join(plan.launch.srun + plan.launch.argv)


@pytest.mark.parametrize(
    "profile_fields, fields, message",
    [
        (
            {"accelerator": "cpu"},
            {"launcher": "python"},
            "task_gpu_bind: binds GPUs to tasks, but this profile requests no GPUs",
        ),
        ({"gpu_request": "none"}, {"launcher": "python"}, "requests no GPUs (accelerator: gpu, gpu_request: none)"),
        (
            {},
            {"launcher": "python", "srun": {"extra": {"gpu-bind": "none"}}},
            "srun.extra.gpu-bind: the cluster profile 'devgpus' binds",
        ),
        (
            {},
            {"launcher": "python", "task": {"trainer": {"model": {"config": {"model_type": "gpt2"}}}}},
            "the built-in runner selects cuda:LOCAL_RANK, which a task would not see",
        ),
    ],
)
def test_what_per_task_gpu_binding_cannot_serve_is_refused(
    tmp_path: Path, profile_fields: dict, fields: dict, message: str
) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe(_recipe(tmp_path, cluster=_gpu_profile(tmp_path, **profile_fields), **fields))


@pytest.mark.slurm
def test_slurm_binds_each_task_to_its_own_gpu_where_the_profile_asks(dev_cluster: str, tmp_path: Path) -> None:
    """Real SLURM GRES binding on the dev cluster's stand-in GPUs: with task_gpu_bind each rank sees
    only the GPU of its local rank; without it every rank sees both (so the binding is what did it)."""
    gres = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout
    if "gpu" not in gres:
        pytest.skip("the dev cluster has no stand-in GPUs (bin/dev-cluster makes them only as root)")
    seen = {}
    for bind in ("single:1", None):
        recipe = _recipe(
            tmp_path,
            cluster=_gpu_profile(tmp_path, task_gpu_bind=bind),
            launcher="python",
            runs_dir=str(tmp_path / f"runs-{bind is not None}"),
            resources={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        )
        done = run_cli("submit", str(recipe), "--follow", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        run_dir = next((tmp_path / f"runs-{bind is not None}" / "opts").iterdir())
        records = [json.loads((run_dir / "contract" / f"rank-{r}.json").read_text()) for r in range(4)]
        assert [r["node"] for r in records] == ["node1", "node1", "node2", "node2"]
        seen[bind] = [r["env"]["CUDA_VISIBLE_DEVICES"] for r in records]
    assert seen == {"single:1": ["0", "1", "0", "1"], None: ["0,1"] * 4}


# --- a launcher in the batch shell ---------------------------------------------------------------------


def test_deepspeed_may_run_in_the_batch_shell_and_start_the_ranks_itself(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path,
            launcher="deepspeed",
            process_model="batch_launcher",
            srun={"label": True, "extra": {"container-image": "img 1"}},
        )
    )
    assert (loaded.recipe.tasks_per_node, loaded.recipe.resources.cpus_per_task) == (2, 1)
    launch = plan_of(render_job(loaded)).launch
    assert launch.hosts == "batch"  # no srun of clusterkit's: DeepSpeed's own starts the ranks
    argv, _ = started(plan_of(render_job(loaded)), launch, "/r")
    assert argv[:5] == ["python3", "-m", "deepspeed.launcher.runner", "--launcher=slurm", "--no_ssh_check"]
    srun = shlex.split(next(word for word in argv if word.startswith("--launcher_args=")).split("=", 1)[1])
    assert srun[2:4] == ["--label", "--container-image=img 1"] and "--output=/r/%j_%t_log.out" in srun
    # Each rank DeepSpeed starts runs the supervisor's rank program, which maps its ids.
    assert argv[-3:] == ["/r/supervisor/__main__.py", "rank", "/r/code/tests/scripts/echo_contract.py"]


def test_mpirun_runs_in_the_batch_shell_with_the_layout_on_its_command_line(tmp_path: Path) -> None:
    loaded = load_recipe(
        _recipe(
            tmp_path,
            launcher="mpirun",
            launcher_args=["-x", "NCCL_DEBUG=INFO", "--bind-to", "core"],
            resources={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "time": "5"},
        )
    )
    assert (loaded.recipe.process_model, loaded.recipe.tasks_per_node) == ("batch_launcher", 2)
    plan = plan_of(render_job(loaded))
    argv, env = started(plan, plan.launch, "/r")
    # Every daemon's srun task gets the node's CPUs of this job: 2 ranks x 1 CPU.
    assert env["SRUN_CPUS_PER_TASK"] == "2"
    assert argv == [
        "mpirun",
        "--np",
        "4",
        "--map-by",
        "ppr:2:node",
        "--bind-to",
        "none",
        "--output-filename",
        "/r/ranks/mpirun-7",
        "-x",
        "NCCL_DEBUG=INFO",
        "--bind-to",
        "core",
        "python3",
        "-u",
        "/r/supervisor/__main__.py",
        "rank",
        "/r/code/tests/scripts/echo_contract.py",
    ]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"launcher": "torchrun", "process_model": "batch_launcher"}, "use launcher: mpirun or deepspeed"),
        (
            {"launcher": "mpirun", "process_model": "launcher_per_node"},
            "is not how launcher mpirun starts ranks (batch_launcher)",
        ),
        (
            {"launcher": "mpirun", "srun": {"label": True}},
            "srun: launcher mpirun starts its daemons with an srun of its own",
        ),
        (
            {"launcher": "mpirun", "launcher_args": ["-np", "8"]},
            "launcher_args[0]: -np is written by clusterkit for mpirun",
        ),
        ({"launcher": "mpirun", "launcher_args": ["--map-by=slot"]}, "--map-by is written by clusterkit for mpirun"),
        ({"launcher": "mpirun", "launcher_args": ["-output-filename", "x"]}, "set runs_dir"),
        (
            {"launcher": "deepspeed", "process_model": "batch_launcher", "preflight": True},
            "preflight is not supported with process_model: batch_launcher",
        ),
        (
            {
                "launcher": "deepspeed",
                "process_model": "batch_launcher",
                "task": {"script": SCRIPT, "args": ["{node_rank}"]},
            },
            "task.args[0]: {node_rank} is known only in a task per rank",
        ),
    ],
)
def test_what_a_batch_shell_launcher_cannot_do_is_refused(tmp_path: Path, fields: dict, message: str) -> None:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **fields))
    assert message in str(raised.value)


def test_a_profile_container_is_refused_with_a_batch_shell_launcher(tmp_path: Path) -> None:
    """The container flags go on clusterkit's launch step, which a batch-shell launcher does not use:
    refused rather than silently run outside the image."""
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    (clusters / "boxed.yaml").write_text(
        yaml.safe_dump({**profile, "name": "boxed", "container": {"image": "img.sqsh"}})
    )
    for launcher in ("mpirun", "deepspeed"):
        with pytest.raises(RecipeError, match="containers are not supported with process_model: batch_launcher"):
            load_recipe(_recipe(tmp_path, cluster="boxed", launcher=launcher, process_model="batch_launcher"))


def test_the_local_executor_refuses_a_batch_shell_launcher(tmp_path: Path) -> None:
    done = run_cli(
        "submit",
        str(_recipe(tmp_path, launcher="deepspeed", process_model="batch_launcher")),
        "--executor",
        "local",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "process_model: batch_launcher needs SLURM" in done.stderr


def test_the_rank_program_runs_the_entry_as_python_would_with_the_ranks_mapped(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\nprint(json.dumps([sys.argv, sys.path[0], {k: os.environ.get(k) for k in "
        "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'NODE_RANK')}]))\n"
    )
    rank_program = REPO / "clusterkit" / "supervisor" / "__main__.py"
    env = {
        **os.environ,
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    env.pop("RANK", None)
    done = subprocess.run(
        [sys.executable, "-u", str(rank_program), "rank", str(probe), "--x", "a b"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    argv, path0, ranks = json.loads(done.stdout)
    assert argv == [str(probe), "--x", "a b"] and path0 == str(tmp_path)
    assert ranks == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1"}
    module = subprocess.run(
        [sys.executable, "-u", str(rank_program), "rank", "--module", "json.tool", "--help"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert module.returncode == 0 and "json.tool" in module.stdout


@pytest.mark.parametrize(
    "value", ["a b", "it's", 'q"uote $(touch {canary}) `touch {canary}`', "back\\slash;&|<>*?", "%j ~ -x"]
)
def test_mpirun_gets_launcher_args_and_task_args_word_for_word(tmp_path: Path, value: str) -> None:
    canary = tmp_path / "canary"
    value = value.format(canary=canary)
    loaded = load_recipe(
        _recipe(
            tmp_path,
            launcher="mpirun",
            launcher_args=["-x", f"V={value}"],
            task={"script": SCRIPT, "args": [value, "--y"]},
        )
    )
    plan = plan_of(render_job(loaded))
    run_dir = f"{tmp_path}/run dir"
    argv, env = started(plan, plan.launch, run_dir)
    assert env["SRUN_CPUS_PER_TASK"] == "2"  # the node's 2 ranks x 1 CPU
    assert argv[-9:] == [
        "-x",
        f"V={value}",
        "python3",
        "-u",
        f"{run_dir}/supervisor/__main__.py",
        "rank",
        f"{run_dir}/code/tests/scripts/echo_contract.py",
        value,
        "--y",
    ]
    assert f"{run_dir}/ranks/mpirun-7" in argv and not canary.exists()


@pytest.mark.parametrize(
    "launcher_env, expected",
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            ("2", "0", "4", "2", "1"),
        ),
        ({"PMI_RANK": "3", "MPI_LOCALRANKID": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, ("3", "1", "4", "2", "1")),
    ],
    ids=["open-mpi", "hydra"],
)
def test_under_mpirun_a_rank_reads_the_mpi_ranks_not_the_daemons_slurm_task(
    launcher_env: dict, expected: tuple
) -> None:
    """mpirun's ranks inherit the SLURM task variables of their node's daemon (SLURM_PROCID is the
    node's number): the MPI launcher's own variables must win."""
    daemon = {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "1(x2)",
    }
    mapped = task_ids({**daemon, **launcher_env})
    assert tuple(mapped[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")) == expected
    assert task_ids(dict(launcher_env))["NODE_RANK"] == "1"  # rank // local size


@pytest.mark.parametrize(
    "value", ["a b", "it's", 'q"uote $(touch {canary}) `touch {canary}`', "back\\slash;&|<>*?", "-x --y=z"]
)
def test_srun_options_reach_deepspeeds_srun_word_for_word(tmp_path: Path, value: str) -> None:
    """The batch-shell launcher hands the step's options to DeepSpeed as one string it shlex-splits:
    each value must come out as one word, as written, and nothing in it may run."""
    canary = tmp_path / "canary"
    value = value.format(canary=canary)
    loaded = load_recipe(
        _recipe(tmp_path, launcher="deepspeed", process_model="batch_launcher", srun={"extra": {"comment": value}})
    )
    plan = plan_of(render_job(loaded))
    argv, _ = started(plan, plan.launch, f"{tmp_path}/run dir")
    given = next(word for word in argv if word.startswith("--launcher_args="))
    words = shlex.split(given.split("=", 1)[1])  # what DeepSpeed's SlurmRunner does with --launcher_args
    assert f"--comment={value}" in words and f"--output={tmp_path}/run dir/%j_%t_log.out" in words
    assert not canary.exists()

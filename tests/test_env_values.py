"""``{env:NAME}`` (issue 31): a site's value (``$SCRATCH``, ``$TMPDIR``) in task args, env values and
the container's image and mounts, filled in where the job runs by the one mechanism that fills in
``{node_rank}`` and ``{run_dir}`` (clusterkit.supervisor.plan.expand): as text, in one pass, never by
a shell; a variable that is not set there stops the step with a line naming it; a malformed reference
is a one-line error when the recipe is loaded. End to end on the local executor: test_program_args.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clusterkit.errors import RecipeError
from clusterkit.load.loader import load_recipe
from clusterkit.render.job import render_job
from clusterkit.spec.runtime_values import malformed_env, placeholders
from clusterkit.supervisor import node
from clusterkit.supervisor.plan import UnsetVariable, expand
from clusterkit.supervisor.ranks import runtime_values
from conftest import REPO
from launch_plans import plan_of, started, task_argv

HOSTILE = "/s $(touch x) 'q' \"d\" `id`\n{env:HOME} {run_dir} *"


def test_expand_fills_in_variables_in_one_pass() -> None:
    values = runtime_values({"SCRATCH": HOSTILE, "RUN_DIR": "/r", "EMPTY": ""})
    assert expand("{env:SCRATCH}/d {run_dir}", values) == HOSTILE + "/d /r"  # the value's braces stay
    assert expand("[{env:EMPTY}]", values) == "[]"  # set but empty is set
    other = "{env :X} {ENV:X} {x} ${SCRATCH} $(id) {env:1X}"
    assert expand(other, {}) == other  # only {env:NAME} is one; a malformed one was refused at load
    with pytest.raises(UnsetVariable) as unset:
        expand("a {env:NOT_SET_HERE} b", values)
    assert unset.value.name == "NOT_SET_HERE"
    assert expand("{node_rank}", {}) == "{node_rank}"  # a value not known yet stays for later, as before


def test_variable_names_are_case_sensitive_and_unset_ones_refused() -> None:
    values = runtime_values({"Scratch": "lower"})
    assert expand("{env:Scratch}", values) == "lower"
    with pytest.raises(UnsetVariable):
        expand("{env:SCRATCH}", values)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("{env:}", "{env:}"),
        ("a{env:1X}b", "{env:1X}"),
        ("{env:A-B}", "{env:A-B}"),
        ("{env:A B}", "{env:A B}"),
        ("{env:A", "{env:A"),
        ("{ env:A}", "{ env:A}"),
        ("{env:$(id)}", "{env:$(id)}"),
        ("{env:OK} {env:}", "{env:}"),
    ],
)
def test_a_malformed_reference_is_found(text: str, bad: str) -> None:
    assert malformed_env(text) == bad


def test_well_formed_references_and_other_braces_pass() -> None:
    for text in ("{env:A}", "{env:_x9}/{env:B}", "{x}", "{{env}}", "env:A", "${A}", "{environment:A}"):
        assert malformed_env(text) is None, text
    assert placeholders("{env:A}/{run_dir}/{env:1}") == {"env:A", "run_dir"}


def _script_recipe(tmp_path: Path, **fields: object) -> Path:
    recipe = {
        "name": "envs",
        "resources": {"nodes": 2, "gpus_per_node": 1, "time": "5"},
        "task": {"script": "train.py"},
        "snapshot": False,
    }
    recipe.update(fields)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    (tmp_path / "train.py").write_text("")
    return path


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"env": {"DATA": "{env:SCRATCH-1}/d"}}, "env.DATA"),
        ({"env": {"PATH": {"prepend": "{env:}/bin"}}}, "env.PATH"),
        ({"network": {"env": {"NCCL_X": "{env:9}"}}}, "network.env.NCCL_X"),
        ({"task": {"script": "train.py", "args": ["--d={env:A B}"]}}, "task.args[0]"),
    ],
)
def test_a_malformed_reference_is_one_line_at_load(tmp_path: Path, fields: dict, key: str) -> None:
    with pytest.raises(RecipeError) as error:
        load_recipe(_script_recipe(tmp_path, **fields))
    line = str(error.value)
    assert len(line.splitlines()) == 1 and f": {key}: {{env:" in line and "names no environment variable" in line, line


def test_an_image_under_a_site_variable_is_filled_in_by_the_supervisor(tmp_path: Path) -> None:
    """pyxis: --container-image is srun's option, which the supervisor fills in from the job's environment."""
    loaded = load_recipe(REPO / "recipes" / "llama-1b-pyxis.yaml", ['container_image="{env:CK_IMAGES}/pytorch.sqsh"'])
    plan = plan_of(render_job(loaded))
    argv, _ = started(plan, plan.launch, "/r", CK_IMAGES=HOSTILE)
    assert argv[5] == f"--container-image={HOSTILE}/pytorch.sqsh"
    with pytest.raises(UnsetVariable):
        started(plan, plan.launch, "/r")
    with pytest.raises(RecipeError, match=r"container_image: \{env:\} names no environment variable"):
        load_recipe(REPO / "recipes" / "llama-1b-pyxis.yaml", ['container_image="{env:}/x.sqsh"'])


def test_an_apptainer_image_and_mounts_are_filled_in_by_the_node_agent(tmp_path: Path) -> None:
    profile = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())
    profile.update(
        name="boxed",
        container={"runtime": "apptainer", "image": "{env:CK_IMAGES}/t.sif", "mounts": ["{env:CK_DATA}:/data"]},
    )
    (tmp_path / "boxed.yaml").write_text(yaml.safe_dump(profile))
    plan = plan_of(render_job(load_recipe(_script_recipe(tmp_path, cluster=str(tmp_path / "boxed.yaml")))))
    argv = task_argv(plan.launch, "/r", CK_IMAGES="/img s", CK_DATA=HOSTILE)
    assert argv[:5] == ["apptainer", "exec", "--bind", f"{HOSTILE}:/data,/r", "/img s/t.sif"]
    bad = dict(profile, container={"runtime": "apptainer", "image": "{env:A-B}/t.sif"})
    (tmp_path / "boxed.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(RecipeError, match=r"boxed.yaml:\d+: container.image: \{env:A-B\} names no environment"):
        load_recipe(_script_recipe(tmp_path, cluster=str(tmp_path / "boxed.yaml")))


def test_the_node_agent_fills_in_args_and_env_values_and_stops_on_an_unset_one(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    loaded = load_recipe(
        _script_recipe(
            tmp_path,
            launcher="python",
            task={"script": "train.py", "args": ["--data={env:CK_SITE}/d", "{env:CK_SITE}"]},
            env={"CK_OUT": "{env:CK_SITE}/out-{node_rank}"},
        )
    )
    plan = plan_of(render_job(loaded))
    assert "CK_OUT" in plan.launch.env_expand
    environ = {
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "node2",
        "CK_SITE": HOSTILE,
        "CK_OUT": "{env:CK_SITE}/out-{node_rank}",
    }
    assert node.task_argv(plan.launch, environ)[-2:] == [f"--data={HOSTILE}/d", HOSTILE]
    assert node.task_environment(plan.launch, environ)["CK_OUT"] == f"{HOSTILE}/out-1"
    # Unset on this node: the program never starts, the node's end is recorded, the log says why.
    environ = {"SLURM_NODEID": "0", "SLURMD_NODENAME": "node1", "RUN_DIR": str(tmp_path)}
    assert node.run_task(plan, plan.launch, environ) == 2
    err = capfd.readouterr().err
    assert err.strip() == (
        "clusterkit: {env:CK_SITE} in the launch step: the variable CK_SITE is not set on node1; set it in the "
        "job's environment (env:, the cluster profile's env or setup:) or drop the {env:...}"
    )
    assert (tmp_path / "ranks" / "node0.exit").read_text().split()[1] == "2"


def test_a_launcher_in_the_batch_shell_gets_its_env_values_filled_in(tmp_path: Path) -> None:
    """mpirun and DeepSpeed's slurm launcher run in the batch shell: the supervisor fills in there."""
    loaded = load_recipe(
        _script_recipe(
            tmp_path,
            launcher="mpirun",
            task={"script": "train.py", "args": ["{env:CK_SITE}/a"]},
            env={"CK_OUT": "{env:CK_SITE}/out"},
        )
    )
    plan = plan_of(render_job(loaded))
    assert plan.launch.hosts == "batch"
    argv, env = started(plan, plan.launch, "/r", CK_SITE=HOSTILE, CK_OUT="{env:CK_SITE}/out")
    assert argv[-1] == f"{HOSTILE}/a" and env["CK_OUT"] == f"{HOSTILE}/out"
    with pytest.raises(UnsetVariable):
        started(plan, plan.launch, "/r", CK_OUT="{env:CK_SITE}/out")


def test_the_supervisor_stops_on_an_unset_variable_it_fills_in(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A launcher in the batch shell (or pyxis's srun options): the supervisor's line, the job's exit 2."""
    from test_supervisor import FakeJob, _plan, _step, _supervise

    plan = _plan(launch=_step(hosts="batch", argv=("echo", "{env:CK_NOPE}"), expand=(1,)))
    job = FakeJob({})
    code, run_dir = _supervise(tmp_path, plan, job)
    assert code == 2 and job.started == []
    assert "clusterkit: {env:CK_NOPE} in the launch step: the variable CK_NOPE is not set on" in capfd.readouterr().out
    assert (run_dir / "exit_code").read_text() == "2\n"


def test_status_names_the_variable_the_supervisor_could_not_fill_in(tmp_path: Path) -> None:
    from clusterkit.runs.record import RunRecord
    from clusterkit.runs.status import first_failure

    line = "{env:CK_NOPE} in the launch step: the variable CK_NOPE is not set on node1; set it in the job's environment"
    (tmp_path / "42_0_log.out").write_text(f"clusterkit: restart 0 of at most 0\nclusterkit: {line}\n")
    record = RunRecord("42", "t", "slurm", str(tmp_path), "r.yaml", 0.0, 1, 1, "mpirun")
    assert first_failure(record) == line

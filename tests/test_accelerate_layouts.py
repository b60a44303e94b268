"""Issue 31: launcher accelerate with DeepSpeed or FSDP, as accelerate itself runs it. The rendered
config and clusterkit's command line are handed to accelerate's own launch code (its argument
parser, its config-file merge, the environment it gives the ranks), so what is asserted is what
accelerate would run; a config of the user's is checked against the recipe's layout; a script's
parallelism.fsdp reaches it as CLUSTERKIT_FSDP_*; and on CPU a real ZeRO-3 step runs through the
local executor, its stage, world and parameter partitioning read from inside the ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from clusterkit.errors import RecipeError
from clusterkit.estimate.memory import Layout
from conftest import REPO, run_cli
from launch_plans import plan_of

PROBE = str(REPO / "tests" / "scripts" / "accelerate_zero_probe.py")
CONTRACT = str(REPO / "tests" / "scripts" / "echo_contract.py")
GPU = "infiniband-h100"


def _recipe(tmp_path: Path, cluster: str = GPU, **fields) -> Path:
    body = {
        "name": "acc",
        "cluster": cluster,
        "launcher": "accelerate",
        "resources": {"nodes": 2, "gpus_per_node": 8, "time": "60"},
        "task": {"script": "/shared/train.py"},
        **fields,
    }
    path = tmp_path / "acc.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _config(tmp_path: Path, body: dict, name: str = "accelerate.yaml") -> str:
    """Your accelerate config; bf16 (the GPU profile's precision) unless it says otherwise."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"mixed_precision": "bf16", **body}))
    return str(path)


def _accelerate_runs(job, run_dir: Path, node_rank: int = 1):
    """What accelerate launch does with the job's command on node ``node_rank``: its parsed
    arguments (after the config file's merge) and the environment it gives the ranks."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    run_dir.mkdir(exist_ok=True)
    for name, text in job.files.items():
        if "/" not in name:
            (run_dir / name).write_text(text)
    argv = list(plan_of(job).launch.argv)
    argv = argv[argv.index("accelerate.commands.launch") + 1 :]
    values = {
        "{node_rank}": str(node_rank),
        "{run_dir}": str(run_dir),
        "{master_addr}": "node1",
        "{master_port}": "29517",
    }
    for placeholder, value in values.items():
        argv = [word.replace(placeholder, value) for word in argv]
    args = _validate_launch_command(launch_command_parser().parse_args(argv))[0]
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ""
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return args, env


# --- rendered from the recipe -------------------------------------------------------------------------


def test_a_scripts_zero3_runs_as_accelerates_deepspeed_with_the_allocations_layout(tmp_path: Path) -> None:
    parallelism = {"zero_stage": 3, "offload_optimizer": "cpu"}
    job = render_job(load_recipe(_recipe(tmp_path, parallelism=parallelism)))
    assert "ds_config.json" not in job.files  # accelerate's config carries the DeepSpeed settings
    args, env = _accelerate_runs(job, tmp_path / "run")
    assert args.use_deepspeed and not args.multi_gpu and args.deepspeed_multinode_launcher == "standard"
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert (args.master_addr, args.master_port) == ("node1", "29517")
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == "none"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_a_scripts_hsdp_with_tp_runs_as_accelerates_fsdp2_parallelism_config(tmp_path: Path) -> None:
    from accelerate.parallelism_config import ParallelismConfig

    fsdp = {"shard_size": 4, "auto_wrap": "LlamaDecoderLayer", "cpu_offload": True, "state_dict": "full"}
    job = render_job(load_recipe(_recipe(tmp_path, parallelism={"tp": 2, "fsdp": fsdp})))
    args, env = _accelerate_runs(job, tmp_path / "run")
    assert args.use_fsdp and not args.multi_gpu and (args.nnodes, args.node_rank) == ("2", 1)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_OFFLOAD_PARAMS"] == "true" and env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer" and env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    sizes = {
        name: env[f"PARALLELISM_CONFIG_{name}"] for name in ("DP_REPLICATE_SIZE", "DP_SHARD_SIZE", "TP_SIZE", "CP_SIZE")
    }
    assert sizes == {"DP_REPLICATE_SIZE": "2", "DP_SHARD_SIZE": "4", "TP_SIZE": "2", "CP_SIZE": "1"}
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=4, tp_size=2)
    assert config.total_size == 16  # every rank of the allocation
    env_sh = job.files["env.sh"]
    assert "export CLUSTERKIT_FSDP_SHARD_SIZE=4\n" in env_sh and "export CLUSTERKIT_FSDP_REPLICATE_SIZE=2\n" in env_sh


def test_plain_full_sharding_needs_no_parallelism_config(tmp_path: Path) -> None:
    job = render_job(load_recipe(_recipe(tmp_path, parallelism={"fsdp": {}})))
    config = yaml.safe_load(job.files["accelerate_config.yaml"])
    assert config["distributed_type"] == "FSDP" and "parallelism_config" not in config
    args, env = _accelerate_runs(job, tmp_path / "run")
    assert args.use_fsdp and "ACCELERATE_USE_PARALLELISM_CONFIG" not in env


def test_data_parallel_stays_multi_gpu(tmp_path: Path) -> None:
    job = render_job(load_recipe(_recipe(tmp_path)))
    assert yaml.safe_load(job.files["accelerate_config.yaml"])["distributed_type"] == "MULTI_GPU"
    assert "--multi_gpu" in plan_of(job).launch.argv


# --- a config of the user's ---------------------------------------------------------------------------

OPEN_R1_ZERO3 = {  # open-r1's recipes/accelerate_configs/zero3.yaml
    "compute_environment": "LOCAL_MACHINE",
    "debug": False,
    "deepspeed_config": {
        "deepspeed_multinode_launcher": "standard",
        "offload_optimizer_device": "none",
        "offload_param_device": "none",
        "zero3_init_flag": True,
        "zero3_save_16bit_model": True,
        "zero_stage": 3,
    },
    "distributed_type": "DEEPSPEED",
    "downcast_bf16": "no",
    "machine_rank": 0,
    "main_training_function": "main",
    "mixed_precision": "bf16",
    "num_machines": 1,
    "num_processes": 8,
    "rdzv_backend": "static",
    "same_network": True,
    "use_cpu": False,
}


def test_your_zero3_config_runs_with_the_allocations_layout(tmp_path: Path) -> None:
    """Its num_machines/num_processes (1 x 8) give way to the allocation's (2 x 8) on the command line."""
    path = _config(tmp_path, OPEN_R1_ZERO3)
    job = render_job(load_recipe(_recipe(tmp_path, parallelism={"zero_stage": 3}, accelerate={"config": path})))
    assert "accelerate_config.yaml" not in job.files and "ds_config.json" not in job.files
    args, env = _accelerate_runs(job, tmp_path / "run")
    assert args.config_file == path and args.use_deepspeed
    assert (args.num_machines, args.num_processes, args.nnodes, args.node_rank) == (2, 16, "2", 1)
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"


def _refused(tmp_path: Path, **fields) -> str:
    with pytest.raises(RecipeError) as raised:
        load_recipe(_recipe(tmp_path, **fields))
    return str(raised.value)


@pytest.mark.parametrize(
    "config, parallelism, message",
    [
        (OPEN_R1_ZERO3, {"zero_stage": 2}, "deepspeed_config.zero_stage is 3, but parallelism.zero_stage is 2"),
        (
            {**OPEN_R1_ZERO3, "mixed_precision": "fp16"},
            {"zero_stage": 3},
            "mixed_precision is fp16, but precision is bf16",
        ),
        (
            {**OPEN_R1_ZERO3, "mixed_precision": None},
            {"zero_stage": 3},
            "mixed_precision is no, but precision is bf16",
        ),
        (
            {**OPEN_R1_ZERO3, "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "cpu"}},
            {"zero_stage": 3},
            "deepspeed_config.offload_optimizer_device is cpu, but parallelism.offload_optimizer is none",
        ),
        (  # left out: accelerate's default, ZeRO-2
            {"distributed_type": "DEEPSPEED", "deepspeed_config": {}},
            {"zero_stage": 3},
            "deepspeed_config.zero_stage is 2, but parallelism.zero_stage is 3",
        ),
        (
            OPEN_R1_ZERO3,
            {},
            "distributed_type DEEPSPEED contradicts the recipe's layout (MULTI_GPU: set parallelism.zero_stage",
        ),
        (
            {"distributed_type": "MULTI_GPU"},
            {"zero_stage": 3},
            "distributed_type MULTI_GPU contradicts the recipe's layout (DEEPSPEED, from parallelism.zero_stage 3)",
        ),
        ({"distributed_type": "FSDP"}, {"zero_stage": 3}, "distributed_type FSDP contradicts"),
        (
            {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}},
            {"fsdp": {"state_dict": "full"}},
            "fsdp_reshard_after_forward is false, but parallelism.fsdp.reshard_after_forward is true",
        ),
        (
            {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}},
            {"fsdp": {"shard_size": 8}},
            "has no parallelism_config, but the recipe's layout is 2 replicas x 8 shards",
        ),
        (
            {
                "distributed_type": "FSDP",
                "fsdp_config": {"fsdp_version": 2},
                "parallelism_config": {"parallelism_config_dp_shard_size": 16},
            },
            {"fsdp": {"shard_size": 8}},
            "parallelism_config_dp_shard_size is 16, but parallelism.fsdp.shard_size is 8",
        ),
        (
            {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}},
            {"fsdp": {"state_dict": "full"}},
            "fsdp_state_dict_type is SHARDED_STATE_DICT, but parallelism.fsdp.state_dict is full",
        ),
    ],
)
def test_your_config_contradicting_the_recipe_is_one_error_naming_both(
    tmp_path: Path, config: dict, parallelism: dict, message: str
) -> None:
    path = _config(tmp_path, config)
    text = _refused(tmp_path, parallelism=parallelism, accelerate={"config": path})
    assert f"accelerate.config: {path}: {message}" in text, text


def test_a_deepspeed_config_file_in_your_config_is_read_and_checked(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}))
    config = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": str(ds)}}
    text = _refused(tmp_path, parallelism={"zero_stage": 3}, accelerate={"config": _config(tmp_path, config)})
    assert "zero_optimization.stage is 2, but parallelism.zero_stage is 3" in text
    assert "zero_optimization.offload_param.device is cpu, but parallelism.offload_params is none" in text
    missing = {
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": str(tmp_path / "no.json")},
    }
    assert "cannot read the DeepSpeed config" in _refused(
        tmp_path, parallelism={"zero_stage": 3}, accelerate={"config": _config(tmp_path, missing)}
    )
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    parallelism = {"zero_stage": 3, "offload_params": "cpu"}
    load_recipe(_recipe(tmp_path, parallelism=parallelism, accelerate={"config": _config(tmp_path, config)}))


@pytest.mark.parametrize(
    "body", ["- a list\n", "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config: [1]\n", "\x00"]
)
def test_an_unreadable_or_odd_config_is_one_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(body)
    text = _refused(tmp_path, parallelism={"fsdp": {}}, accelerate={"config": str(path)})
    assert text.count("\n") == 0 and "accelerate.config" in text


@pytest.mark.parametrize(
    "fields, config",
    [
        ({"fsdp": {}}, {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": "abc"}}),
        ({"fsdp": {}}, {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": [2]}}),
        ({"fsdp": {}}, {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": "SHARD\nALL"}}),
        ({"fsdp": {}}, {"distributed_type": "FSDP", "fsdp_config": {"fsdp_sharding_strategy": 9}}),
        ({"fsdp": {}}, {"distributed_type": "FSDP", "parallelism_config": "x"}),
        ({"zero_stage": 3}, {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": "three\x1b[2J"}}),
        ({"zero_stage": 3}, {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": ["a"]}}),
        ({"zero_stage": 3}, {"distributed_type": ["DEEPSPEED"]}),
        ({"zero_stage": 3}, {"distributed_type": "DEEPSPEED\nFSDP"}),
    ],
)
def test_a_hostile_config_is_one_printable_line(tmp_path: Path, fields: dict, config: dict) -> None:
    text = _refused(tmp_path, parallelism=fields, accelerate={"config": _config(tmp_path, config)})
    assert "\n" not in text and "\x1b" not in text and "accelerate.config" in text, text


def test_a_deepspeed_config_file_that_is_no_file_is_one_error(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "ds.fifo"
    os.mkfifo(fifo)
    for where in (fifo, tmp_path):  # a FIFO (must not block) and a folder
        config = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": str(where)}}
        text = _refused(tmp_path, parallelism={"zero_stage": 3}, accelerate={"config": _config(tmp_path, config)})
        assert "cannot read the DeepSpeed config" in text and "\n" not in text
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"zero_optimization": {"stage": "3", "offload_optimizer": 5}}))
    config = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": str(odd)}}
    text = _refused(tmp_path, parallelism={"zero_stage": 3}, accelerate={"config": _config(tmp_path, config)})
    assert "zero_optimization.offload_optimizer.device is 5, but parallelism.offload_optimizer is none" in text
    assert "stage" not in text  # "3" is the stage 3 accelerate reads


# --- what cannot be applied -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"parallelism": {"zero_stage": 2}, "task": {"trainer": {"model": {"pretrained": "gpt2"}}}},
            "parallelism.zero_stage: the built-in runner starts ZeRO itself",
        ),
        (
            {"parallelism": {"zero_stage": 2}, "deepspeed": {"config": {"gradient_clipping": 1.0}}},
            "deepspeed.config: under launcher: accelerate a script's DeepSpeed settings are accelerate's",
        ),
        (
            {"parallelism": {"pp": 2, "fsdp": {}}},
            "parallelism.pp: accelerate's FSDP config has no pipeline parallelism",
        ),
        ({"parallelism": {"ep": 2, "fsdp": {}}}, "parallelism.ep: accelerate's FSDP config has no expert parallelism"),
        (
            {"parallelism": {"tp": 2, "fsdp": {"shard_size": 16}}},
            "shard_size: 16 must divide the 8 data-parallel ranks",
        ),
        ({"parallelism": {"zero_stage": 1, "fsdp": {}}}, "FSDP2 replaces DeepSpeed"),
    ],
)
def test_what_accelerate_cannot_apply_is_refused(tmp_path: Path, fields: dict, message: str) -> None:
    assert message in _refused(tmp_path, **fields)


def test_fsdp_under_accelerate_on_cpu_is_refused_but_a_scripts_own_runs(tmp_path: Path) -> None:
    cpu = {"cluster": "dev", "resources": {"nodes": 2, "gpus_per_node": 2, "time": "5"}}
    text = _refused(tmp_path, parallelism={"fsdp": {}}, **cpu)
    assert "FSDP2 cannot run on CPU (cluster profile 'dev') under launcher: accelerate" in text
    # torchrun: the script applies FSDP2 itself (torch's fully_shard runs on gloo), told how by CLUSTERKIT_FSDP_*
    job = render_job(
        load_recipe(_recipe(tmp_path, launcher="torchrun", parallelism={"fsdp": {"shard_size": 2}}, **cpu))
    )
    lines = [line for line in job.files["env.sh"].splitlines() if "CLUSTERKIT_FSDP_" in line]
    assert lines == [
        "export CLUSTERKIT_FSDP_SHARD_SIZE=2",
        "export CLUSTERKIT_FSDP_REPLICATE_SIZE=2",
        "export CLUSTERKIT_FSDP_RESHARD_AFTER_FORWARD=1",
        "export CLUSTERKIT_FSDP_CPU_OFFLOAD=0",
        "export CLUSTERKIT_FSDP_ACTIVATION_CHECKPOINTING=0",
        "export CLUSTERKIT_FSDP_STATE_DICT=sharded",
    ]


def test_a_scripts_fsdp_is_planned_over_its_shard_group(tmp_path: Path) -> None:
    path = _recipe(
        tmp_path,
        launcher="torchrun",
        parallelism={"tp": 2, "fsdp": {"shard_size": 4}},
        task={"script": "/shared/train.py", "model_size": 1_000_000_000},
    )
    layout = Layout.of_recipe(load_recipe(path).recipe)
    assert (layout.dp, layout.tp, layout.zero_stage) == (4, 2, 3)
    done = run_cli("plan", str(path), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["current"]["layout"]["zero_stage"] == 3


# --- real processes ----------------------------------------------------------------------------------


@pytest.mark.train
def test_zero3_through_accelerate_really_runs_on_the_local_executor(tmp_path: Path) -> None:
    """Two nodes x one rank: accelerate's DEEPSPEED type, the engine's stage 3 over both ranks, each
    holding half of every weight (read inside the ranks, not inferred from an exit code)."""
    recipe = _recipe(
        tmp_path,
        cluster="dev",
        runs_dir=str(tmp_path / "runs"),
        resources={"nodes": 2, "gpus_per_node": 1, "time": "5", "cpus_per_task": 1},
        parallelism={"zero_stage": 3},
        task={"script": PROBE},
    )
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "acc").iterdir())
    seen = [json.loads(p.read_text()) for p in sorted((run_dir / "probe").glob("rank-*.json"))]
    assert len(seen) == 2
    for rank in seen:
        assert rank["distributed_type"] == "DistributedType.DEEPSPEED" and rank["num_processes"] == 2
        assert rank["zero_stage"] == 3 and rank["engine_world_size"] == 2
        assert (rank["weight_numel"], rank["local_weight_numel"]) == (32, 16)  # partitioned, not replicated


def test_a_scripts_fsdp_layout_reaches_every_rank(tmp_path: Path) -> None:
    """Real processes under torchrun: each of the 4 ranks reads the HSDP layout (2 replicas x 2) in its environment."""
    recipe = _recipe(
        tmp_path,
        cluster="dev",
        launcher="torchrun",
        runs_dir=str(tmp_path / "runs"),
        resources={"nodes": 2, "gpus_per_node": 2, "time": "5", "cpus_per_task": 1},
        parallelism={"fsdp": {"shard_size": 2, "state_dict": "full"}},
        task={"script": CONTRACT},
    )
    done = run_cli("submit", str(recipe), "--executor", "local", "--follow", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "acc").iterdir())
    seen = [json.loads(p.read_text())["env"] for p in sorted((run_dir / "contract").glob("rank-*.json"))]
    assert len(seen) == 4
    for env in seen:
        fsdp = {name: value for name, value in env.items() if name.startswith("CLUSTERKIT_FSDP_")}
        assert fsdp == {
            "CLUSTERKIT_FSDP_SHARD_SIZE": "2",
            "CLUSTERKIT_FSDP_REPLICATE_SIZE": "2",
            "CLUSTERKIT_FSDP_RESHARD_AFTER_FORWARD": "1",
            "CLUSTERKIT_FSDP_CPU_OFFLOAD": "0",
            "CLUSTERKIT_FSDP_ACTIVATION_CHECKPOINTING": "0",
            "CLUSTERKIT_FSDP_STATE_DICT": "full",
        }

"""What validates is what runs: inputs that used to validate (or crash validate) and then did
something else in the job. Each gives one line `file:line: key: message`, exit 2, nothing written,
or now works as written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe, render_job
from conftest import RECIPES, run_cli

SCRIPT = """\
name: t
resources: {nodes: 2, gpus_per_node: 2, time: "10"}
task:
  script: train.py
"""
TRAINER = """\
name: t
resources: {nodes: 2, gpus_per_node: 2, time: "10"}
task:
  trainer:
    model:
      config: {model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_positions: 128, vocab_size: 512}
"""
LLAMA_SCRIPT = """\
name: t
cluster: infiniband-h100
resources: {nodes: 2, gpus_per_node: 8, time: "10"}
task:
  script: train.py
  model_config: {model_type: llama, hidden_size: 4096, intermediate_size: 11008, num_hidden_layers: 32,
                 num_attention_heads: 32, vocab_size: 32000}
"""


def _write(directory: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _refused(recipe: Path, *args: str, cwd: Path | None = None) -> list[str]:
    """Render must fail with exit 2, one line per problem, no traceback and no output written."""
    out = recipe.parent / "out"
    done = run_cli("render", str(recipe), "-o", str(out), *args, cwd=cwd)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not out.exists(), "nothing may be written for a refused recipe"
    return [line for line in done.stderr.splitlines() if ": warning: " not in line]


def _validates(recipe: Path, *args: str) -> str:
    done = run_cli("validate", str(recipe), *args)
    assert done.returncode == 0, done.stderr
    return done.stderr


# 1. A layout error leaves dp unresolved: later checks must not compute with it.
@pytest.mark.parametrize(
    "recipe,override,fragment",
    [
        (RECIPES / "llama-7b-zero3-ib.yaml", "parallelism.tp=3", "tp*pp = 3 does not divide the 16 GPUs"),
        (RECIPES / "ddp-1node-8gpu.yaml", "parallelism.tp=3", "tp*pp = 3 does not divide the 8 GPUs"),
        (None, "parallelism.tp=3", "tp*pp = 3 does not divide the 16 GPUs"),
        (
            RECIPES / "llama-7b-zero3-ib.yaml",
            "parallelism.micro_batch_size=3",
            "not divisible by micro_batch_size*dp = 3*16",
        ),
    ],
    ids=["7b-trainer", "ddp-trainer", "script-with-model", "batch-indivisible-with-deepspeed"],
)
def test_layout_error_is_reported_not_a_traceback(
    tmp_path: Path, recipe: Path | None, override: str, fragment: str
) -> None:
    recipe = recipe or _write(tmp_path, LLAMA_SCRIPT)
    done = run_cli("validate", str(recipe), "--set", override)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert fragment in done.stderr


# 2. The built-in runner does not apply tensor parallelism: refused, and never planned.
def test_trainer_with_tp_on_a_model_autotp_cannot_shard_is_refused(tmp_path: Path) -> None:
    """tp for the built-in runner is DeepSpeed AutoTP's, which refuses GPT-2: said at validate, not ignored."""
    errors = _refused(_write(tmp_path, TRAINER + "parallelism: {tp: 2}\n"))
    assert errors[0].startswith(
        f"{tmp_path / 'recipe.yaml'}:6: task.trainer.model.config: DeepSpeed AutoTP cannot shard gpt2 models"
    )


def test_plan_proposes_only_what_the_trainer_runner_applies(tmp_path: Path) -> None:
    """For the built-in runner: AutoTP layouts (ZeRO 0-2) for a Llama, never pipeline parallelism;
    the best one, applied, validates."""
    recipe = tmp_path / "7b.yaml"
    recipe.write_text((RECIPES / "llama-7b-zero3-ib.yaml").read_text())
    done = run_cli("plan", str(recipe), "--json", "--top", "1000", "--apply")
    assert done.returncode == 0, done.stderr
    ranked = json.loads(done.stdout)["ranked"]
    assert ranked and all(r["layout"]["pp"] == 1 for r in ranked)
    assert all(r["layout"]["zero_stage"] <= 2 for r in ranked if r["layout"]["tp"] > 1)
    assert any(r["layout"]["tp"] > 1 for r in ranked)
    assert _validates(tmp_path / "7b.planned.yaml") is not None


# 3. A sequence longer than the model's positions.
@pytest.mark.parametrize(
    "config",
    [
        "{model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_positions: 64, vocab_size: 512}",
        "{model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_ctx: 64, vocab_size: 512}",
        "{model_type: llama, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4,"
        " vocab_size: 512, max_position_embeddings: 64}",
    ],
    ids=["n_positions", "n_ctx", "max_position_embeddings"],
)
def test_seq_len_longer_than_positions(tmp_path: Path, config: str) -> None:
    text = TRAINER.replace(TRAINER.splitlines()[5].split("config: ", 1)[1], config) + "    dataset: {seq_len: 65}\n"
    errors = _refused(_write(tmp_path, text))
    assert errors == [
        f"{tmp_path / 'recipe.yaml'}:7: task.trainer.dataset.seq_len: 65 is longer than the model's 64 positions"
    ]
    _validates(_write(tmp_path, text.replace("seq_len: 65", "seq_len: 64")))


# 4. task.trainer.args keys are TrainingArguments fields.
def test_misspelt_training_argument(tmp_path: Path) -> None:
    errors = _refused(_write(tmp_path, TRAINER + "    args: {learning_rte: 0.001, max_steps: 3}\n"))
    assert errors == [
        f"{tmp_path / 'recipe.yaml'}:7: task.trainer.args.learning_rte: unknown TrainingArguments key "
        "'learning_rte'; did you mean 'learning_rate'?"
    ]


def test_training_arguments_of_the_shipped_recipes_are_known() -> None:
    for recipe in ("tiny-gpt2-cpu.yaml", "llama-7b-zero3-ib.yaml", "ddp-1node-8gpu.yaml"):
        assert "TrainingArguments" not in _validates(RECIPES / recipe)


def test_training_arguments_unchecked_without_transformers(tmp_path: Path) -> None:
    recipe = _write(tmp_path, TRAINER + "    args: {learning_rte: 0.001}\n")
    # sys.modules[name] = None is how Python marks a module as not importable: find_spec returns None.
    code = (
        "import sys; sys.modules['transformers'] = None; from clusterkit.cli.main import main; "
        f"sys.exit(main(['validate', {str(recipe)!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning: task.trainer.args: unchecked (transformers not installed here)" in done.stderr


# 5. Paths are resolved once, against the file that wrote them, whatever the current directory.
def test_paths_resolve_against_the_recipe_not_the_cwd(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.txt").write_text("hello world " * 100)
    (project / "model").mkdir()
    (project / "model" / "config.json").write_text(
        json.dumps(
            {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 512}
        )
    )
    (project / "ds.json").write_text(json.dumps({"gradient_clipping": 0.5}))
    recipe = _write(
        project,
        """\
        name: t
        resources: {nodes: 1, gpus_per_node: 2, time: "10"}
        parallelism: {zero_stage: 1}
        deepspeed: {config: ds.json}
        task:
          trainer:
            model: {config: model, tokenizer: gpt2}
            dataset: {type: text, path: data/train.txt, seq_len: 64}
        """,
    )
    done = run_cli("render", str(recipe), "-o", str(elsewhere / "out"), cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    trainer = yaml.safe_load((elsewhere / "out" / "recipe.resolved.yaml").read_text())["task"]["trainer"]
    assert trainer["dataset"]["path"] == str(project / "data" / "train.txt")
    assert trainer["model"]["config"] == str(project / "model")
    assert trainer["model"]["tokenizer"] == "gpt2", "a hub name stays as written"
    assert json.loads((elsewhere / "out" / "ds_config.json").read_text())["gradient_clipping"] == 0.5


def test_runner_reads_the_validated_dataset_from_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from clusterkit.runtime.data import build_dataset

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.txt").write_text("abcdefgh" * 64)
    recipe = _write(tmp_path / "project", TRAINER + "    dataset: {type: text, path: train.txt, seq_len: 64}\n")
    trainer = load_recipe(recipe).recipe.task.trainer
    assert trainer is not None
    (tmp_path / "job-cwd").mkdir()
    monkeypatch.chdir(tmp_path / "job-cwd")  # the runner starts where the job was submitted
    assert len(build_dataset(trainer.dataset, None, 512, 0, Path.cwd())) == 8


@pytest.mark.parametrize(
    "written,local", [("gpt2", False), ("org/model", False), ("./tok", True), ("tok", True), ("../project/tok", True)]
)
def test_model_references_local_or_hub(tmp_path: Path, written: str, local: bool) -> None:
    project = tmp_path / "project"
    (project / "tok").mkdir(parents=True)
    recipe = _write(project, TRAINER.replace("    model:\n", f"    model:\n      tokenizer: {written}\n"))
    tokenizer = load_recipe(recipe).recipe.task.trainer.model.tokenizer  # type: ignore[union-attr]
    assert tokenizer == (str(project / written) if local else written)


def test_path_in_a_base_is_relative_to_the_base(tmp_path: Path) -> None:
    (tmp_path / "common" / "data").mkdir(parents=True)
    (tmp_path / "common" / "data" / "t.txt").write_text("x" * 1000)
    _write(tmp_path / "common", "task: {trainer: {dataset: {type: text, path: data/t.txt}}}\n", "base.yaml")
    recipe = _write(tmp_path / "team", "extends: ../common/base.yaml\n" + TRAINER)
    dataset = load_recipe(recipe).recipe.task.trainer.dataset  # type: ignore[union-attr]
    assert Path(dataset.path).resolve() == (tmp_path / "common" / "data" / "t.txt").resolve()  # type: ignore[arg-type]


def test_missing_dataset_is_an_error(tmp_path: Path) -> None:
    errors = _refused(_write(tmp_path, TRAINER + "    dataset: {type: jsonl, path: data/missing.jsonl}\n"))
    assert errors == [
        f"{tmp_path / 'recipe.yaml'}:7: task.trainer.dataset.path: not found: "
        f"{tmp_path / 'data' / 'missing.jsonl'} (a relative path is read from the recipe's folder)"
    ]


def test_dataset_path_from_set_is_relative_to_the_cwd(tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("x" * 1000)
    recipe = _write(tmp_path / "r", TRAINER + "    dataset: {type: text}\n")
    done = run_cli("validate", str(recipe), "--set", "task.trainer.dataset.path=here.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


# 6. Environment names the job script, the launcher or SLURM own.
@pytest.mark.parametrize(
    "name,owner",
    [
        ("RUN_DIR", "the job script"),
        ("PATH", "replacing PATH hides srun"),
        ("CLUSTERKIT_PREEMPT_SIGNAL", "clusterkit"),
        ("CLUSTERKIT_ANYTHING", "clusterkit"),
        ("MASTER_ADDR", "the job script"),
        ("MASTER_PORT", "set master_port"),
        ("RANK", "the launcher"),
        ("LOCAL_RANK", "the launcher"),
        ("WORLD_SIZE", "the launcher"),
        ("LOCAL_WORLD_SIZE", "the launcher"),
        ("NODE_RANK", "the launcher"),
        ("SLURM_NTASKS", "SLURM"),
    ],
)
@pytest.mark.parametrize(
    "where,line", [("env: {%s: x}\n", 5), ("network: {env: {%s: x}}\n", 5)], ids=["env", "network.env"]
)
def test_owned_env_names_are_refused(tmp_path: Path, name: str, owner: str, where: str, line: int) -> None:
    errors = _refused(_write(tmp_path, SCRIPT + where % name))
    key = "env" if where.startswith("env") else "network.env"
    assert errors[0].startswith(f"{tmp_path / 'recipe.yaml'}:{line}: {key}.{name}: {name} is set by "), errors
    assert owner in errors[0]


def _profile(directory: Path, extra: str) -> None:
    _write(
        directory / "clusters",
        "name: mine\naccelerator: cpu\ngpus_per_node: 2\ncpus_per_node: 4\ninterconnect: loopback\n" + extra,
        "mine.yaml",
    )


@pytest.mark.parametrize("extra", ["env: {WORLD_SIZE: 4}\n", "network_env: {SLURM_JOB_ID: 1}\n"])
def test_owned_env_names_in_the_profile_are_refused(tmp_path: Path, extra: str) -> None:
    _profile(tmp_path, extra)
    errors = _refused(_write(tmp_path, SCRIPT + "cluster: mine\n"))
    assert errors[0].startswith(f"{tmp_path / 'clusters' / 'mine.yaml'}:6: "), errors
    assert "is set by" in errors[0]


def test_ld_preload_is_allowed(tmp_path: Path) -> None:
    _validates(_write(tmp_path, SCRIPT + "env: {LD_PRELOAD: /usr/lib/libtcmalloc.so}\n"))


# Names the shell reads as code to run (or as how to run): a value there runs in every bash of the job,
# outside the job script and past what validate shows. Shell goes in setup:, where it is written on purpose.
@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND"])
@pytest.mark.parametrize(
    "where,line",
    [("env: {%s: /tmp/x}\n", 5), ("network: {env: {%s: /tmp/x}}\n", 5), ("secrets: [%s]\n", 5)],
    ids=["env", "network.env", "secrets"],
)
def test_env_names_the_shell_runs_are_refused(tmp_path: Path, name: str, where: str, line: int) -> None:
    errors = _refused(_write(tmp_path, SCRIPT + where % name))
    key = {"env": f"env.{name}", "net": f"network.env.{name}", "sec": "secrets[0]"}[where[:3]]
    assert errors[0].startswith(f"{tmp_path / 'recipe.yaml'}:{line}: {key}: {name} "), errors
    assert "setup:" in errors[0], errors


def test_env_names_the_shell_runs_are_refused_in_the_profile_too(tmp_path: Path) -> None:
    _profile(tmp_path, "env: {BASH_ENV: /etc/site.sh}\n")
    errors = _refused(_write(tmp_path, SCRIPT + "cluster: mine\n"))
    assert errors[0].startswith(f"{tmp_path / 'clusters' / 'mine.yaml'}:6: env.BASH_ENV: BASH_ENV "), errors


# 7. A runs_dir SLURM and the shell would read differently.
@pytest.mark.parametrize(
    "runs_dir,fragment",
    [
        ("~/runs", "'~' is expanded by clusterkit"),
        ("runs/%j", "'%' is a pattern in #SBATCH --output"),
        ("-runs", "starting with '-' reads as an option"),
    ],
)
def test_runs_dir_that_would_split_the_run(tmp_path: Path, runs_dir: str, fragment: str) -> None:
    errors = _refused(_write(tmp_path, SCRIPT + f"runs_dir: '{runs_dir}'\n"))
    assert errors == [f"{tmp_path / 'recipe.yaml'}:5: runs_dir: {errors[0].split(': runs_dir: ', 1)[1]}"]
    assert fragment in errors[0] and "give a relative path" in errors[0]
    _profile(tmp_path, f"runs_dir: '{runs_dir}'\n")
    errors = _refused(_write(tmp_path, SCRIPT + "cluster: mine\n"))
    assert errors[0].startswith(f"{tmp_path / 'clusters' / 'mine.yaml'}:6: runs_dir: ") and fragment in errors[0]


# 8. YAML 1.1 base-60: `time: 12:00` is SLURM's 12 minutes, not 720.
@pytest.mark.parametrize("written,meaning", [("12:00", "12 min 00 s"), ("1:30:00", "1 h 30 min 00 s")])
def test_unquoted_time_stays_slurm_time(tmp_path: Path, written: str, meaning: str) -> None:
    recipe = _write(tmp_path, SCRIPT.replace('time: "10"', f"time: {written}"))
    loaded = load_recipe(recipe)
    assert loaded.recipe.resources.time == written
    assert [str(w) for w in loaded.warnings if "SLURM time" in w.message] == [
        f"{recipe}:2: warning: resources.time: {written} is read as the SLURM time '{written}' ({meaning}; YAML 1.1 "
        f'would make it a base-60 number); quote it ("{written}") to say so'
    ]
    done = run_cli("render", str(recipe), "-o", str(tmp_path / "out"))
    assert done.returncode == 0 and f"#SBATCH --time={written}\n" in (tmp_path / "out" / "job.sbatch").read_text()
    assert load_recipe(_write(tmp_path, SCRIPT), [f"resources.time={written}"]).recipe.resources.time == written


# 9. Model-config values of the wrong type or size.
@pytest.mark.parametrize(
    "field,value,shown",
    [
        ("n_head", '"four"', '"four"'),
        ("n_layer", "2.5", "2.5"),
        ("vocab_size", "true", "true"),
        ("n_embd", "0", "0"),
        ("n_head", "-4", "-4"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_model_config_value_of_the_wrong_type(tmp_path: Path, field: str, value: str, shown: str, command: str) -> None:
    config = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 512}
    text = TRAINER.replace(
        TRAINER.splitlines()[5].split("config: ", 1)[1],
        "{" + ", ".join(f"{k}: {value if k == field else v}" for k, v in config.items()) + "}",
    )
    recipe = _write(tmp_path, text.replace('time: "10"}', 'time: "10"}\ncluster: infiniband-h100'))
    done = run_cli(command, str(recipe))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"{recipe}:7: task.trainer.model.config.{field}: must be a positive whole number, got {shown}"
    )


def test_hidden_size_must_split_into_heads(tmp_path: Path) -> None:
    errors = _refused(_write(tmp_path, TRAINER.replace("n_embd: 64", "n_embd: 66")))
    assert errors == [
        f"{tmp_path / 'recipe.yaml'}:6: task.trainer.model.config: the hidden size 66 is not divisible "
        "by the 4 attention heads"
    ]


# 10. An alias bomb fails at once.
def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{','.join(['*' + previous] * 9)}]")
    recipe = _write(tmp_path, "\n".join(lines) + "\n")
    assert len(recipe.read_bytes()) < 1024
    done = run_cli("validate", str(recipe), timeout=20)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "more than 100000 values once aliases are expanded" in done.stderr


# 11. plan's numbers are checked by argparse, and the search is bounded.
@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--global-batch", "1e12"], "'1e12' is not a whole number"),
        (["--global-batch", "1000000000000"], "give a number from 1 to 100,000,000"),
        (["--global-batch", "-5"], "give a number from 1 to 100,000,000"),
        (["--global-batch", "0"], "give a number from 1 to 100,000,000"),
        (["--top", "-3"], "argument --top: '-3': give a number from 1 to 1,000"),
        (["--top", "0"], "argument --top: '0': give a number from 1 to 1,000"),
    ],
)
def test_plan_arguments_are_checked(args: list[str], fragment: str) -> None:
    done = run_cli("plan", str(RECIPES / "llama-7b-zero3-ib.yaml"), *args)
    assert done.returncode == 2 and fragment in done.stderr and done.stdout == "", done.stderr


def test_plan_at_the_largest_global_batch_is_quick(tmp_path: Path) -> None:
    recipe = _write(tmp_path, LLAMA_SCRIPT.replace("nodes: 2", "nodes: 1000"))
    done = run_cli("plan", str(recipe), "--global-batch", "100000000", "--top", "3", "--json", timeout=30)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["ranked"]) == 3


# 12. A folder of recipes with their base files.
def test_validate_folder_skips_base_files(tmp_path: Path) -> None:
    _write(tmp_path, "resources: {nodes: 2, gpus_per_node: 2, time: '10'}\n", "base.yaml")
    _write(tmp_path, "extends: base.yaml\nname: a\ntask: {script: a.py}\n", "a.yaml")
    _write(tmp_path, "extends: base.yaml\nname: b\ntask: {script: b.py}\n", "b.yaml")
    done = run_cli("validate", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "base.yaml" not in done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "2 of 2 recipes valid (1 base file skipped)"


def test_a_complete_recipe_that_is_also_extended_is_validated(tmp_path: Path) -> None:
    _write(tmp_path, SCRIPT.replace("nodes: 2", "nodes: 0"), "small.yaml")
    _write(tmp_path, "extends: small.yaml\nresources: {nodes: 2}\n", "big.yaml")
    done = run_cli("validate", str(tmp_path))
    assert done.returncode == 2
    assert f"{tmp_path / 'small.yaml'}:2: resources.nodes" in done.stderr
    assert "1 of 2 recipes valid" in done.stdout


# 13. extra_sbatch must not replace what clusterkit derives, nor conflict with it.
@pytest.mark.parametrize(
    "flag,value,fragment",
    [
        ("nodes", "4", "set resources.nodes instead"),
        ("ntasks", "8", "a launcher task per node, or a task per rank"),
        ("ntasks-per-node", "2", "a launcher task per node, or a task per rank"),
        ("output", "x.log", "set runs_dir"),
        ("error", "x.err", "set runs_dir"),
        ("job-name", "x", "set name instead"),
        ("chdir", "/tmp", "set runs_dir"),
        ("gres", "gpu:4", "resources.gpus_per_node"),
        ("gpus-per-node", "4", "resources.gpus_per_node"),
        ("gpus", "4", "resources.gpus_per_node"),
        ("signal", "B:TERM@60", "preemption.signal"),
        ("requeue", "false", "preemption.requeue"),
        ("open-mode", "truncate", "runs_dir"),
        ("cpus-per-task", "4", "resources.cpus_per_task"),
        ("mem", "10G", "resources.mem"),
        ("time", "5", "resources.time"),
        ("partition", "x", "resources.partition"),
        ("account", "x", "resources.account"),
        ("qos", "x", "resources.qos"),
        ("constraint", "x", "resources.constraint"),
        ("reservation", "x", "resources.reservation"),
        ("exclusive", "true", "resources.exclusive"),
        ("export", "NONE", "set env (every node gets"),
        ("cpus-per-gpu", "4", "conflicts with the --cpus-per-task"),
        ("array", "0-3", "set resources.array"),
        ("out", "x.log", "abbreviates --output"),
        ("ntasks-per-n", "2", "abbreviates --ntasks-per-node"),
    ],
)
def test_extra_sbatch_cannot_override_derived_options(tmp_path: Path, flag: str, value: str, fragment: str) -> None:
    errors = _refused(
        _write(tmp_path, SCRIPT.replace('time: "10"}', f'time: "10", extra_sbatch: {{{flag}: {value}}}}}'))
    )
    assert errors[0].startswith(f"{tmp_path / 'recipe.yaml'}:2: resources.extra_sbatch.{flag}: --{flag} "), errors
    assert fragment in errors[0]


def test_extra_sbatch_dependency_and_mail_type_still_work(tmp_path: Path) -> None:
    # `clusterkit bench` chains its runs with resources.extra_sbatch.dependency=afterany:ID.
    recipe = _write(tmp_path, SCRIPT.replace('time: "10"}', 'time: "10", extra_sbatch: {mail-type: END}}'))
    done = run_cli(
        "render", str(recipe), "-o", str(tmp_path / "out"), "--set", "resources.extra_sbatch.dependency=afterany:123"
    )
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "out" / "job.sbatch").read_text()
    assert "#SBATCH --dependency=afterany:123\n" in script and "#SBATCH --mail-type=END\n" in script


# 14. Environment values reach the job as written.
@pytest.mark.parametrize(
    "written", ["3.10", "1e3", "0x10", "010", "yes", "no", "on", "off", "1_000", "12:00", "+1", ".5"]
)
def test_env_value_keeps_its_text(tmp_path: Path, written: str) -> None:
    recipe = _write(tmp_path, SCRIPT + f"env: {{A: {written}}}\nnetwork: {{env: {{B: {written}}}}}\n")
    loaded = load_recipe(recipe)
    assert loaded.recipe.env == {"A": written} and loaded.recipe.network.env == {"B": written}
    assert load_recipe(_write(tmp_path, SCRIPT, "plain.yaml"), [f"env.C={written}"]).recipe.env == {"C": written}
    done = run_cli("render", str(recipe), "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    env_sh = (tmp_path / "out" / "env.sh").read_text()
    assert f"export A={written}\n" in env_sh and f"export B={written}\n" in env_sh


def test_env_true_and_false_stay_the_shell_convention(tmp_path: Path) -> None:
    recipe = _write(tmp_path, SCRIPT + "env: {A: true, B: False, C: 'true'}\n")
    assert load_recipe(recipe).recipe.env == {"A": True, "B": False, "C": "true"}
    done = run_cli("render", str(recipe), "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    env_sh = (tmp_path / "out" / "env.sh").read_text()
    assert "export A=1\n" in env_sh and "export B=0\n" in env_sh and "export C=true\n" in env_sh


def test_profile_env_value_keeps_its_text(tmp_path: Path) -> None:
    _profile(tmp_path, "env: {PYVER: 3.10}\nnetwork_env: {NCCL_X: 010}\n")
    loaded = load_recipe(_write(tmp_path, SCRIPT + "cluster: mine\n"))
    assert loaded.profile.env == {"PYVER": "3.10"} and loaded.profile.network_env == {"NCCL_X": "010"}


def test_an_empty_env_value_is_an_error_and_null_unsets(tmp_path: Path) -> None:
    errors = _refused(_write(tmp_path, SCRIPT + "env:\n  A:\n"))
    assert errors == [
        f"{tmp_path / 'recipe.yaml'}:6: env.A: an environment value cannot be empty; "
        "write '' for an empty value, or null to unset the variable"
    ]
    env_sh = render_job(load_recipe(_write(tmp_path, SCRIPT + "env: {A: ~, B: null}\n"))).files["env.sh"]
    assert "\nunset A\n" in env_sh and "\nunset B\n" in env_sh


def test_only_env_values_keep_their_text(tmp_path: Path) -> None:
    recipe = _write(tmp_path, SCRIPT.replace('time: "10"}', 'time: "10", exclusive: yes}') + "env: {A: '3.10'}\n")
    loaded = load_recipe(recipe)
    assert loaded.recipe.env == {"A": "3.10"} and loaded.recipe.resources.exclusive is True

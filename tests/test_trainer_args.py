"""task.trainer.args values reach TrainingArguments as the numbers they were written as.

TrainingArguments converts nothing: ``learning_rate: "3e-4"`` is kept as text and only the optimizer,
in the job, refuses it. Two things stop that before a job is queued: a float written as YAML 1.2 and
Python write it (``3e-4``, which YAML 1.1 reads as text) is a number, and validate checks the value
of every bool/int/float field of TrainingArguments (read from its source, not imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from clusterkit import load_recipe
from clusterkit.load import trainer_args
from clusterkit.load.sweep import parse_grid
from conftest import RECIPES, run_cli

TRAINER = """\
name: t
resources: {nodes: 1, gpus_per_node: 2, time: "10"}
task:
  trainer:
    model:
      config: {model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_positions: 128, vocab_size: 512}
    args:
"""


def _recipe(tmp_path: Path, args: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(TRAINER) + textwrap.indent(args, "      ") + "\n")
    return path


@pytest.mark.parametrize(
    "written,number",
    [
        ("3e-4", 3e-4),
        ("1e-3", 1e-3),
        ("1E+3", 1000.0),
        ("-2e-2", -0.02),
        ("5e0", 5.0),
        ("3.0e-4", 3e-4),
        ("1.5E3", 1500.0),
        ("1_000e-3", 1.0),
    ],
)
def test_a_float_with_an_exponent_is_a_number_everywhere(written: str, number: float, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, f"learning_rate: {written}")
    assert load_recipe(recipe).recipe.task.trainer.args["learning_rate"] == number
    assert (
        load_recipe(recipe, [f"task.trainer.args.learning_rate={written}"]).recipe.task.trainer.args["learning_rate"]
        == number
    )
    assert parse_grid([f"task.trainer.args.learning_rate={written},0.1"]) == {
        "task.trainer.args.learning_rate": [number, 0.1]
    }


@pytest.mark.parametrize("written", ["1.2.3", "e5", "1e", "1e-", "0x1e3", "12:00:00"])
def test_what_is_no_float_stays_what_it_was(written: str, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, f"run_name: {written}")
    value = load_recipe(recipe).recipe.task.trainer.args["run_name"]
    assert value == (483 if written == "0x1e3" else written)  # a hex int stays an int


def test_the_sweep_example_of_the_help_sweeps_numbers(tmp_path: Path) -> None:
    """The --help example `--grid task.trainer.args.learning_rate=1e-3,3e-4`: each point's resolved
    recipe, the one its job reads, holds a float."""
    done = run_cli(
        "sweep",
        str(RECIPES / "tiny-gpt2-cpu.yaml"),
        "--grid",
        "task.trainer.args.learning_rate=1e-3,3e-4",
        "--dry-run",
        "--json",
        "--executor",
        "local",
    )
    assert done.returncode == 0, done.stderr
    request = json.loads(done.stdout)
    rates = [
        yaml.safe_load(request["files"][f"{point}/recipe.resolved.yaml"])["task"]["trainer"]["args"]["learning_rate"]
        for point in (0, 1)
    ]
    assert rates == [1e-3, 3e-4]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            "learning_rate: '3e-4'",
            "learning_rate: expected a number, got the text '3e-4' (in quotes it is text: write it without them)",
        ),
        # control characters and shell in the text: one line, shown escaped, never run
        (
            'learning_rate: "3e-4\\n$(id)\\x1b[31m"',
            "learning_rate: expected a number, got the text '3e-4\\n$(id)\\x1b[31m'",
        ),
        ("max_steps: 1e5", "max_steps: expected a whole number, got 100000.0 (write 100000)"),
        ("max_steps: 2.5", "max_steps: expected a whole number, got 2.5"),
        (
            "max_steps: '30'",
            "max_steps: expected a whole number, got the text '30' (in quotes it is text: write it without them)",
        ),
        ("seed: true", "seed: expected a whole number, got true"),
        ("learning_rate: null", "learning_rate: expected a number, got null"),
        (
            "logging_first_step: 'true'",
            "logging_first_step: expected true or false, got the text 'true' (in quotes it is text: write it without them)",
        ),
        ("logging_first_step: enabled", "logging_first_step: expected true or false, got the text 'enabled'"),
        ("logging_first_step: 1", "logging_first_step: expected true or false, got 1"),
        ("gradient_checkpointing: 0", "gradient_checkpointing: expected true or false or null, got 0"),
        ("eval_steps: fast", "eval_steps: expected a number or null, got the text 'fast'"),
    ],
)
def test_a_value_its_field_cannot_take_is_refused_at_validate(args: str, message: str, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, args)
    done = run_cli("validate", str(recipe))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"{recipe}:8: task.trainer.args.{message}"]


@pytest.mark.parametrize(
    "args",
    [
        "learning_rate: 3e-4",
        "max_steps: 30",
        "num_train_epochs: 2",
        "eval_steps: null",
        "tf32: null",
        "gradient_checkpointing: false",
        "logging_first_step: yes",
        "save_steps: 0.5",
        "lr_scheduler_kwargs: {power: 2}",
        "report_to: [tensorboard]",
    ],
)
def test_values_their_fields_take_validate(args: str, tmp_path: Path) -> None:
    done = run_cli("validate", "-q", str(_recipe(tmp_path, args)))
    assert done.returncode == 0, done.stderr


def test_what_validate_passes_the_optimizer_takes(tmp_path: Path) -> None:
    """The job's own construction (TrainingArguments, then the optimizer) with the validated args;
    the text that YAML 1.1 made of `3e-4` is what broke it, and validate now refuses that."""
    import torch
    from transformers import TrainingArguments

    args = load_recipe(_recipe(tmp_path, "learning_rate: 3e-4\nadam_epsilon: 1e-8")).recipe.task.trainer.args
    settings = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], **args)
    optimizer = torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(2))], lr=settings.learning_rate, eps=settings.adam_epsilon
    )
    assert optimizer.param_groups[0]["lr"] == 3e-4
    with pytest.raises(TypeError):
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr="3e-4")


def test_field_kinds_are_read_from_the_source() -> None:
    fields = trainer_args.training_arguments()
    assert isinstance(fields, dict), fields
    assert (fields["learning_rate"], fields["max_steps"], fields["logging_first_step"]) == ("float", "int", "bool")
    assert fields["eval_steps"] == "float?" and fields["tf32"] == "bool?"
    assert fields["report_to"] is None and fields["lr_scheduler_type"] is None  # unions: TrainingArguments' to check


@pytest.mark.parametrize(
    "cached",
    [
        '{"key": "K", "names": ["learning_rate"]}',  # what clusterkit wrote before kinds
        '{"format": 2, "key": "K", "fields": {"learning_rate": "complex"}}',
        "{not json",
        "[" * 100_000,
    ],  # nested deeper than json.loads goes
    ids=["names only", "an unknown kind", "no JSON", "nested too deep"],
)
def test_an_old_or_damaged_cache_is_read_again_from_the_source(cached: str, tmp_path: Path) -> None:
    entry = tmp_path / "cache" / "clusterkit" / "training_args.json"
    entry.parent.mkdir(parents=True)
    source = trainer_args._source_file()
    stat = source.stat()
    entry.write_text(
        cached.replace('"K"', json.dumps(f"{source}:{stat.st_size}:{stat.st_mtime_ns}"))
    )  # its key is right
    recipe = _recipe(tmp_path, "learning_rate: '3e-4'")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for _ in range(2):  # the first reads the source and writes the cache again, the second reads that
        done = subprocess.run(
            [sys.executable, "-m", "clusterkit", "validate", str(recipe)], capture_output=True, text=True, env=env
        )
        assert done.returncode == 2 and "expected a number, got the text '3e-4'" in done.stderr, done.stderr
        written = json.loads(entry.read_text())
        assert written["format"] == 2 and written["fields"]["learning_rate"] == "float"


def _cached_fields(cache_home: Path, fields: dict[str, str | None]) -> Path:
    """A cache entry for this transformers' source (its key is right) that lists ``fields``, in a
    private cache folder, as clusterkit writes them."""
    root = cache_home / "clusterkit"
    root.mkdir(parents=True, mode=0o700)
    source = trainer_args._source_file()
    stat = source.stat()
    entry = root / "training_args.json"
    entry.write_text(json.dumps({"format": 2, "key": f"{source}:{stat.st_size}:{stat.st_mtime_ns}", "fields": fields}))
    entry.chmod(0o600)
    return entry


def _validate_bogus_key(tmp_path: Path, cache_home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return run_cli("validate", str(_recipe(tmp_path, "bogus_field: 1")), env=env, timeout=60)


def test_the_cached_fields_are_what_validate_checks_against(tmp_path: Path) -> None:
    """The cache saves the parse: validate reads the entry (here forged, to be seen)."""
    _cached_fields(tmp_path / "cache", {"bogus_field": "int"})
    done = _validate_bogus_key(tmp_path, tmp_path / "cache")
    assert done.returncode == 0, done.stderr


def _moved_behind_a_link(entry: Path) -> None:
    elsewhere = entry.parent.parent / "elsewhere.json"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)


def _fifo(entry: Path) -> None:
    entry.unlink()
    os.mkfifo(entry, 0o600)


FOREIGN_ENTRIES = {
    "an entry of another user": lambda entry: os.chown(entry, 65534, 65534),
    "a cache root of another user": lambda entry: os.chown(entry.parent, 65534, 65534),
    "a group-writable entry": lambda entry: entry.chmod(0o660),
    "a world-writable cache root": lambda entry: entry.parent.chmod(0o777),
    "a linked entry": _moved_behind_a_link,
    "a FIFO": _fifo,  # read, it would wait for a writer
}


@pytest.mark.parametrize("case", sorted(FOREIGN_ENTRIES))
def test_fields_someone_else_could_have_cached_are_not_trusted(case: str, tmp_path: Path) -> None:
    FOREIGN_ENTRIES[case](_cached_fields(tmp_path / "cache", {"bogus_field": "int"}))
    done = _validate_bogus_key(tmp_path, tmp_path / "cache")
    assert done.returncode == 2 and "unknown TrainingArguments key 'bogus_field'" in done.stderr, done.stderr

"""Offline compute nodes: a profile's ``offline``/``hf_home`` reach every rank's environment, validate
warns when the hub cache lacks a model such a job loads, ``prefetch`` says what it would fetch, and a
tiny training run on an offline profile loads its "hub" model from the cache.

No hub is reachable here: the download itself (snapshot_download) is not exercised. The caches are
laid out from local files by tests/hub_cache.py (the hub's documented layout; huggingface_hub has no
public writer that works without an endpoint), and every test first checks that huggingface_hub's own
scan_cache_dir and try_to_load_from_cache recognise the layout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli
from hub_cache import COMMIT, cache_folder
from test_json_shapes import as_documented

huggingface_hub = pytest.importorskip("huggingface_hub", reason="the hub extra: pip install 'clusterkit[hub]'")

REPO_ID = "tiny-org/tiny-gpt2"
DEV = yaml.safe_load((REPO / "recipes" / "clusters" / "dev.yaml").read_text())


def _profile(tmp_path: Path, **fields: object) -> Path:
    """The dev cluster's profile (so the same recipe runs on the local executor and on the dev
    cluster) under another name, with ``fields`` added."""
    (tmp_path / "clusters").mkdir(exist_ok=True)
    path = tmp_path / "clusters" / "dev-offline.yaml"
    path.write_text(yaml.safe_dump({**DEV, "name": "dev-offline", "runs_dir": str(tmp_path / "runs"), **fields}))
    return path


def _recipe(tmp_path: Path, model: dict, **fields: object) -> Path:
    path = tmp_path / "offline.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "offline",
                "cluster": "dev-offline",
                "launcher": "torchrun",
                "resources": {"nodes": 1, "gpus_per_node": 2, "cpus_per_task": 1, "time": "00:10:00"},
                "parallelism": {"micro_batch_size": 2, "gradient_accumulation_steps": 1},
                "task": {
                    "trainer": {
                        "model": model,
                        "dataset": {"type": "synthetic", "seq_len": 16, "num_samples": 32},
                        "args": {"max_steps": 2, "logging_steps": 1, "save_steps": 100},
                    }
                },
                **fields,
            },
            sort_keys=False,
        )
    )
    return path


def _hf_home(tmp_path: Path) -> Path:
    return tmp_path / "shared fs" / "hf ~%-home"  # spaces and shell-ish characters on purpose


def _cache_files(hf_home: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A repository of small files in the cache, checked with the hub library's own readers."""
    source = hf_home.parent / f"src-{repo_id.replace('/', '_')}"
    source.mkdir(parents=True)
    for name, text in files.items():
        (source / name).write_text(text)
    snapshot = cache_folder(hf_home / "hub", repo_id, source)
    repos = {repo.repo_id: repo for repo in huggingface_hub.scan_cache_dir(hf_home / "hub").repos}
    assert repos[repo_id].repo_type == "model" and [r.commit_hash for r in repos[repo_id].revisions] == [COMMIT]
    found = huggingface_hub.try_to_load_from_cache(repo_id, next(iter(files)), cache_dir=hf_home / "hub")
    assert found == str(snapshot / next(iter(files)))
    return snapshot


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update({k: v for k, v in changes.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def test_offline_profile_env_reaches_the_shell_and_the_recipe_env_wins(tmp_path: Path) -> None:
    hf_home = _hf_home(tmp_path)
    _profile(tmp_path, offline=True, hf_home=str(hf_home))
    path = _recipe(tmp_path, {"pretrained": REPO_ID}, env={"HF_DATASETS_OFFLINE": 0})
    done = run_cli("render", str(path), "-o", str(tmp_path / "out"), cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr
    # A real shell reads env.sh over an inherited HF_HUB_CACHE that would point the job elsewhere.
    shown = subprocess.run(
        ["bash", "-c", f'. "{tmp_path}/out/env.sh" && env -0'],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HF_HUB_CACHE": "/elsewhere", "HF_HUB_OFFLINE": "0"},
        check=True,
    )
    env = dict(item.split("=", 1) for item in shown.stdout.split("\0") if item)
    assert env["HF_HOME"] == str(hf_home) and env["HF_HUB_OFFLINE"] == "1" and "HF_HUB_CACHE" not in env
    assert env["HF_DATASETS_OFFLINE"] == "0"  # the recipe's env overrides the profile's default
    _profile(tmp_path)  # an online profile sets none of it
    done = run_cli("render", str(path), "-o", str(tmp_path / "online"), cwd=tmp_path, env=_env())
    assert done.returncode == 0 and "HF_HOME" not in (tmp_path / "online" / "env.sh").read_text()
    assert "HF_HUB_OFFLINE" not in (tmp_path / "online" / "env.sh").read_text()


@pytest.mark.parametrize(
    "hf_home, message",
    [
        ("relative/hf", "an absolute path"),
        ("/shared/{job_id}/hf", "without { or }"),
        ("/shared/hf\n/x", "an absolute path"),
    ],
)
def test_hf_home_is_one_absolute_path_the_same_everywhere(tmp_path: Path, hf_home: str, message: str) -> None:
    profile = _profile(tmp_path, offline=True, hf_home=hf_home)
    done = run_cli("validate", str(_recipe(tmp_path, {"pretrained": REPO_ID})), cwd=tmp_path, env=_env())
    line = next(n for n, text in enumerate(profile.read_text().splitlines(), 1) if text.startswith("hf_home"))
    assert done.returncode == 2 and f"{profile}:{line}: hf_home: " in done.stderr and message in done.stderr


def test_validate_warns_for_a_model_missing_from_the_cache_and_not_for_a_cached_one(tmp_path: Path) -> None:
    hf_home = _hf_home(tmp_path)
    _profile(tmp_path, offline=True, hf_home=str(hf_home))
    path = _recipe(tmp_path, {"pretrained": REPO_ID, "tokenizer": "other-org/tok"})
    lines = path.read_text().splitlines()
    model_line = next(n for n, text in enumerate(lines, 1) if "pretrained:" in text)
    tokenizer_line = next(n for n, text in enumerate(lines, 1) if "tokenizer:" in text)

    def warnings() -> list[str]:
        done = run_cli("validate", str(path), cwd=tmp_path, env=_env())
        assert done.returncode == 0 and f"{path}: ok" in done.stdout, done.stderr
        return [line for line in done.stderr.splitlines() if "hub cache" in line]

    missing = warnings()
    assert len(missing) == 2 and all(line.count("\n") == 0 for line in missing)
    assert missing[0].startswith(
        f"{path}:{model_line}: warning: task.trainer.model.pretrained: '{REPO_ID}' is not in the hub cache {hf_home}/hub"
    )
    assert missing[1].startswith(f"{path}:{tokenizer_line}: warning: task.trainer.model.tokenizer: 'other-org/tok'")
    _cache_files(hf_home, REPO_ID, {"config.json": "{}"})
    assert [line for line in warnings() if "'other-org/tok'" not in line] == []
    _cache_files(hf_home, "other-org/tok", {"tokenizer_config.json": "{}"})
    assert warnings() == []
    _profile(tmp_path, hf_home=str(tmp_path / "empty"))  # online: the hub is there to download from
    assert warnings() == []


def test_validate_imports_the_hub_library_only_for_an_offline_profile_naming_a_hub_model(tmp_path: Path) -> None:
    probe = (
        "import sys, clusterkit; clusterkit.validate(sys.argv[1]); "
        "print(sorted(m for m in ('huggingface_hub', 'torch', 'transformers') if m in sys.modules))"
    )
    path = _recipe(tmp_path, {"pretrained": REPO_ID})
    for profile, imported in (({}, []), ({"offline": True}, ["huggingface_hub"])):
        _profile(tmp_path, **profile)
        done = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=_env(), cwd=tmp_path
        )
        assert done.returncode == 0 and json.loads(done.stdout.replace("'", '"')) == imported, done.stderr
    _recipe(tmp_path, {"config": {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 300}})
    done = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_prefetch_refuses_a_recipe_without_a_hub_model(tmp_path: Path) -> None:
    _profile(tmp_path, offline=True, hf_home=str(_hf_home(tmp_path)))
    local = tmp_path / "my model"
    local.mkdir()
    path = _recipe(tmp_path, {"pretrained": str(local)})
    done = run_cli("prefetch", str(path), cwd=tmp_path, env=_env())
    assert (
        done.returncode == 2
        and done.stderr.strip()
        == (
            f"{path}: names no hub model (task.trainer.model.pretrained and tokenizer are local paths or unset): "
            "nothing to prefetch"
        )
        and done.stdout == ""
    )
    assert not _hf_home(tmp_path).exists()
    path = _recipe(tmp_path, {"pretrained": "not a/hub name"})  # neither a local path nor a repository name
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "pretrained:" in text)
    for command in ("validate", "prefetch"):
        done = run_cli(command, str(path), cwd=tmp_path, env=_env())
        said = [text for text in done.stderr.splitlines() if "neither a local path nor a hub name" in text]
        assert len(said) == 1 and said[0].startswith(f"{path}:{line}: "), done.stderr
        assert done.returncode == (0 if command == "validate" else 2)  # validate: a warning


def test_prefetch_says_a_cached_model_is_there_and_asks_no_hub(tmp_path: Path) -> None:
    hf_home = _hf_home(tmp_path)
    _profile(tmp_path, offline=True, hf_home=str(hf_home))
    snapshot = _cache_files(hf_home, REPO_ID, {"config.json": "{}"})
    path = _recipe(tmp_path, {"pretrained": REPO_ID})
    with socket.create_server(("127.0.0.1", 0)) as hub:  # a hub endpoint that notes any connection
        hub.setblocking(False)
        env = _env(HF_ENDPOINT=f"http://127.0.0.1:{hub.getsockname()[1]}")
        done = run_cli("prefetch", str(path), "--json", cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        report = as_documented(done, "clusterkit prefetch --json RECIPE")
        assert (
            report["cache_dir"] == f"{hf_home}/hub" and report["offline"] is True and report["cluster"] == "dev-offline"
        )
        assert report["models"] == [
            {"repo_id": REPO_ID, "key": "task.trainer.model.pretrained", "status": "cached", "snapshot": str(snapshot)}
        ]
        done = run_cli("prefetch", str(path), cwd=tmp_path, env=env)
        assert done.returncode == 0 and done.stdout == f"{REPO_ID}: already in the cache: {snapshot}\n"
        with pytest.raises(BlockingIOError):
            hub.accept()  # no one called


def test_prefetch_of_a_model_the_unreachable_hub_cannot_give_fails_on_one_line(tmp_path: Path) -> None:
    """A tokenizer not cached beside a cached model: its download is tried, against an endpoint that
    refuses connections, and fails as an external error (exit 1) naming it; nothing says "downloaded"."""
    hf_home = _hf_home(tmp_path)
    _profile(tmp_path, offline=True, hf_home=str(hf_home))
    _cache_files(hf_home, REPO_ID, {"config.json": "{}"})
    with socket.create_server(("127.0.0.1", 0)) as closed:
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    path = _recipe(tmp_path, {"pretrained": REPO_ID, "tokenizer": "other-org/tok"})
    done = run_cli("prefetch", str(path), cwd=tmp_path, env=_env(HF_ENDPOINT=endpoint))
    assert done.returncode == 1 and done.stderr.startswith(
        "clusterkit: downloading 'other-org/tok' from the model hub failed: "
    )
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def _cache_tiny_model(hf_home: Path) -> Path:
    """A 1-layer GPT-2 and a word-level tokenizer saved with save_pretrained, laid into the cache as
    hub model REPO_ID; n_embd 24 marks the weights as these."""
    transformers = pytest.importorskip("transformers", reason="the train extra: pip install 'clusterkit[train]'")
    from tokenizers import Tokenizer, models, pre_tokenizers

    source = hf_home.parent / "saved"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=1, n_head=2, n_embd=24, n_positions=32, vocab_size=300, bos_token_id=1, eos_token_id=1
        )
    ).save_pretrained(source)
    words = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "a": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<eos>").save_pretrained(
        source
    )
    snapshot = cache_folder(hf_home / "hub", REPO_ID, source)
    assert huggingface_hub.try_to_load_from_cache(REPO_ID, "model.safetensors", cache_dir=hf_home / "hub") == str(
        snapshot / "model.safetensors"
    )
    assert [repo.nb_files for repo in huggingface_hub.scan_cache_dir(hf_home / "hub").repos] == [
        len(list(source.iterdir()))
    ]
    return snapshot


@pytest.mark.parametrize("executor", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_training_on_an_offline_profile_loads_the_hub_model_from_the_cache(
    executor: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if executor == "slurm":
        request.getfixturevalue("dev_cluster")
    hf_home = _hf_home(tmp_path)
    _cache_tiny_model(hf_home)
    _profile(tmp_path, offline=True, hf_home=str(hf_home))
    path = _recipe(tmp_path, {"pretrained": REPO_ID})
    # The submitting shell says nothing of the hub but an HF_HUB_CACHE that env.sh must set aside.
    done = run_cli(
        "submit",
        str(path),
        "--executor",
        executor,
        "--follow",
        cwd=tmp_path,
        env=_env(HF_HUB_CACHE=str(tmp_path / "elsewhere")),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next((tmp_path / "runs" / "offline").iterdir())
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank-*.json"))]
    assert [r["rank"] for r in records] == [0, 1] and all(r["global_step"] == 2 for r in records)
    for record in records:
        assert record["hub"] == {
            "model": REPO_ID,
            "offline": True,
            "cache_dir": f"{hf_home}/hub",
            "hf_home": str(hf_home),
        }
    assert json.loads((run_dir / "model" / "config.json").read_text())["n_embd"] == 24  # the cached model, trained
    assert not (tmp_path / "elsewhere").exists()

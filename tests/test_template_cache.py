"""The compiled-template cache (render/template_cache.py) changes how fast a render is, never what
it writes: real CLI processes with their own $XDG_CACHE_HOME, cold, warm, racing, damaged and unwritable."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jinja2.bccache import bc_magic

from conftest import REPO

RECIPE = REPO / "recipes" / "llama-7b-zero3-ib.yaml"


def _render(cache_home: Path, out: Path, *more: str, recipe: Path = RECIPE) -> dict[str, bytes]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run([sys.executable, "-m", "clusterkit", "render", str(recipe), "-o", str(out), *more],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _entries(cache_home: Path) -> list[Path]:
    return sorted(cache_home.glob("clusterkit/templates-*/*.cache"))


def test_a_warm_cache_renders_the_same_files(tmp_path: Path) -> None:
    cold = _render(tmp_path / "cache", tmp_path / "cold")
    assert _entries(tmp_path / "cache")  # the compiled templates were kept
    assert _render(tmp_path / "cache", tmp_path / "warm") == cold


def test_damaged_entries_are_compiled_again(tmp_path: Path) -> None:
    expected = _render(tmp_path / "cache", tmp_path / "first")
    entries = _entries(tmp_path / "cache")
    damaged = [bc_magic + b"garbage", bc_magic + b"(", bc_magic + b"\x80\x04\x95garbage" * 8, b""]
    for index, entry in enumerate(entries):
        whole = entry.read_bytes()
        entry.write_bytes([whole[: len(whole) // 2], *damaged][index % 5])  # the first: cut inside the code
    assert _render(tmp_path / "cache", tmp_path / "again") == expected


def test_an_unwritable_cache_folder_only_costs_the_compile(tmp_path: Path) -> None:
    expected = _render(tmp_path / "cache", tmp_path / "first")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")  # root may write anywhere: a file where the folder would go stops everyone
    assert _render(not_a_folder, tmp_path / "second") == expected
    assert _render(tmp_path / "cache", tmp_path / "third") == expected


def test_concurrent_cold_renders_all_succeed_and_agree(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda i: _render(tmp_path / "cache", tmp_path / f"out{i}"), range(8)))
    assert all(output == outputs[0] for output in outputs)
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # no half-written entry left behind


def test_an_edited_template_is_compiled_again(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "env.sh.j2").write_text("# first\n")
    assert _render(tmp_path / "cache", tmp_path / "a", "--template-dir", str(ops))["env.sh"].endswith(b"# first\n")
    (ops / "env.sh.j2").write_text("# second\n")
    assert _render(tmp_path / "cache", tmp_path / "b", "--template-dir", str(ops))["env.sh"].endswith(b"# second\n")

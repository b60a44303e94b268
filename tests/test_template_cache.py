"""The compiled-template cache (render/template_cache.py) changes how fast a render is, never what
it writes: real CLI processes with their own $XDG_CACHE_HOME, cold, warm, racing, damaged and unwritable.
An entry is code that the next render runs, so one that someone else could have written (another
user's folder or entry, a folder others may write, a link, a FIFO) is never read, and none is pickled."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from jinja2.bccache import bc_magic

from clusterkit.load.loader import load_recipe
from clusterkit.render.job import jinja_environment, template_search_path
from conftest import REPO

RECIPE = REPO / "recipes" / "llama-7b-zero3-ib.yaml"
ANOTHER_USER = 65534  # nobody
FORGED = "#!/bin/bash\nFORGED {{ 6 * 7 }}\n"  # a script sbatch would take, from the forged entry


def _render(cache_home: Path, out: Path, *more: str, recipe: Path = RECIPE) -> dict[str, bytes]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run(
        [sys.executable, "-m", "clusterkit", "render", str(recipe), "-o", str(out), *more],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
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


def _forge(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Entries for every template the render reads, written by this clusterkit's own cache (as an
    attacker would copy them), that compile to FORGED instead: a render that reads one says so."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    jinja_environment.cache_clear()  # its cache is taken when the environment is made
    env = jinja_environment(template_search_path(load_recipe(RECIPE)))
    for name in (name for name in env.list_templates() if name.endswith(".j2")):
        source, filename, _ = env.loader.get_source(env, name)
        bucket = env.bytecode_cache.get_bucket(env, name, filename, source)
        bucket.code = env.compile(FORGED, name, filename)
        env.bytecode_cache.dump_bytecode(bucket)
    jinja_environment.cache_clear()
    return _entries(cache_home)


def test_a_private_entry_is_what_the_next_render_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache saves the compile: a render reads the entries (here forged, to be seen)."""
    assert _forge(tmp_path / "cache", monkeypatch)
    assert _render(tmp_path / "cache", tmp_path / "out")["job.sbatch"] == b"#!/bin/bash\nFORGED 42\n"


def test_cache_folders_and_entries_are_private(tmp_path: Path) -> None:
    _render(tmp_path / "cache", tmp_path / "out")
    root = tmp_path / "cache" / "clusterkit"
    for path in [root, *root.rglob("*")]:
        status = path.lstat()
        assert status.st_uid == os.geteuid() and not status.st_mode & 0o077, (path, oct(status.st_mode))


def _chown(path: Path) -> None:
    os.chown(path, ANOTHER_USER, ANOTHER_USER)


def _chmod(mode: int) -> Callable[[Path], None]:
    return lambda path: path.chmod(mode)


def _moved_behind_a_link(path: Path) -> None:
    elsewhere = path.parent.parent / f"elsewhere-{path.name}"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)


def _each_entry(change: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: [change(entry) for entry in root.glob("templates-*/*.cache")]


def _each_folder(change: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: [change(folder) for folder in root.glob("templates-*")]


FOREIGN = {
    "an entry of another user": _each_entry(_chown),
    "a folder of another user": _each_folder(_chown),
    "a cache root of another user": _chown,
    "a group-writable entry": _each_entry(_chmod(0o620)),
    "a group-writable folder": _each_folder(_chmod(0o770)),
    "a world-writable cache root (sticky, as /tmp)": _chmod(0o1777),
    "a linked entry": _each_entry(_moved_behind_a_link),
    "a linked folder": _each_folder(_moved_behind_a_link),
}


@pytest.mark.parametrize("case", sorted(FOREIGN))
def test_an_entry_someone_else_could_have_written_is_never_run(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _render(tmp_path / "clean", tmp_path / "expected")
    assert _forge(tmp_path / "cache", monkeypatch)
    FOREIGN[case](tmp_path / "cache" / "clusterkit")
    assert _render(tmp_path / "cache", tmp_path / "out") == expected


def test_a_cache_root_another_user_made_first_gets_no_entry(tmp_path: Path) -> None:
    expected = _render(tmp_path / "clean", tmp_path / "expected")
    root = tmp_path / "cache" / "clusterkit"
    root.mkdir(parents=True, mode=0o700)
    _chown(root)
    assert _render(tmp_path / "cache", tmp_path / "out") == expected
    assert not list(root.iterdir())


def test_an_entry_that_is_a_fifo_is_compiled_again_without_waiting(tmp_path: Path) -> None:
    expected = _render(tmp_path / "cache", tmp_path / "first")
    for entry in _entries(tmp_path / "cache"):
        entry.unlink()
        os.mkfifo(entry, 0o600)
    assert _render(tmp_path / "cache", tmp_path / "again") == expected  # within _render's timeout


class _Marker:
    """Unpickled, it creates a file: what a pickled entry can make its reader do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return open, (str(self.path), "w")


@pytest.mark.parametrize("owner", ["mine", "another user's"])
def test_no_entry_is_ever_unpickled(owner: str, tmp_path: Path) -> None:
    expected = _render(tmp_path / "cache", tmp_path / "first")
    marker = tmp_path / "unpickled"
    for entry in _entries(tmp_path / "cache"):  # Jinja's own format: a pickled checksum, then the code
        entry.write_bytes(bc_magic + pickle.dumps(_Marker(marker)) + entry.read_bytes()[len(bc_magic) :])
        if owner != "mine":
            _chown(entry)
    assert _render(tmp_path / "cache", tmp_path / "again") == expected
    assert not marker.exists()

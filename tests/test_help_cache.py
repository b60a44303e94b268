"""``--help`` from the help cache (clusterkit.cli.help_cache): the text printed from an entry is
exactly argparse's for that command and terminal, an entry is never used once a source it was
formatted from changed, and a missing, damaged or unwritable cache only costs the parser's time.
Each process here has a cache folder of its own ($XDG_CACHE_HOME) and a fixed width ($COLUMNS)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clusterkit.cli import help_cache
from clusterkit.cli.parser import build_parser, help_texts

COMMANDS = sorted(help_texts(build_parser()))  # "" is the top level


def _env(cache: Path, columns: int = 100, **more: str) -> dict[str, str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": str(columns), **more}
    env.pop("_ARGCOMPLETE", None)
    return env


# Prints what main() printed, its status, and whether the parser was built (argparse imported).
PROBE = ("import contextlib, io, sys\nfrom clusterkit.cli.main import main\nout = io.StringIO()\n"
         "with contextlib.redirect_stdout(out):\n    try:\n        code = main(sys.argv[1:])\n"
         "    except SystemExit as exit:\n        code = exit.code\n"
         "sys.stderr.write(f'{code} {\"argparse\" in sys.modules}')\nsys.stdout.write(out.getvalue())")


def _help(cache: Path, *argv: str, columns: int = 100, **env: str) -> tuple[str, int, bool]:
    """What ``clusterkit ARGV`` printed, its status, whether it built the parser."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True,
                          env=_env(cache, columns, **env))
    code, built = done.stderr.rsplit("\n", 1)[-1].split()
    return done.stdout, int(code), built == "True"


def _argparse_help(*argv: str, columns: int = 100) -> str:
    """What argparse itself prints for ``argv`` (no cache involved)."""
    code = ("import contextlib, io, sys\nfrom clusterkit.cli.parser import build_parser\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    try:\n        build_parser().parse_args(sys.argv[1:])\n"
            "    except SystemExit:\n        pass\nsys.stdout.write(out.getvalue())")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True,
                          env=_env(Path("/nonexistent"), columns)).stdout


def _every_cached_help(cache: Path, columns: int) -> dict[str, str]:
    """Every command's help as one process reads it from the cache, after a --help stored it."""
    code = ("import json, sys\nfrom clusterkit.cli import help_cache\n"
            "print(json.dumps({c: help_cache.cached_help([c, '--help'] if c else ['--help']) for c in sys.argv[1:]}))")
    import json

    done = subprocess.run([sys.executable, "-c", code, *COMMANDS], capture_output=True, text=True, check=True,
                          env=_env(cache, columns))
    return json.loads(done.stdout)


@pytest.mark.parametrize("columns", [100, 57])
def test_every_cached_help_is_what_argparse_prints(columns: int, tmp_path: Path) -> None:
    first, code, built = _help(tmp_path, "--help", columns=columns)
    assert (code, built) == (0, True) and first == _argparse_help("--help", columns=columns)
    cached = _every_cached_help(tmp_path, columns)
    for command in COMMANDS:
        argv = [command, "--help"] if command else ["--help"]
        assert cached[command] == _argparse_help(*argv, columns=columns), command


def test_a_second_help_builds_no_parser(tmp_path: Path) -> None:
    text, code, built = _help(tmp_path, "validate", "--help")
    assert (code, built) == (0, True) and text.startswith("usage: clusterkit validate")
    again, code, built = _help(tmp_path, "validate", "-h")
    assert (again, code, built) == (text, 0, False)


def test_another_width_is_another_entry(tmp_path: Path) -> None:
    wide, _, _ = _help(tmp_path, "submit", "--help", columns=160)
    narrow, _, built = _help(tmp_path, "submit", "--help", columns=60)
    def usage_lines(text: str) -> int:
        return len(text.split("\n\n")[0].splitlines())

    assert built and usage_lines(narrow) > usage_lines(wide)
    assert _help(tmp_path, "submit", "--help", columns=160) == (wide, 0, False)
    assert _help(tmp_path, "submit", "--help", columns=60) == (narrow, 0, False)


def test_an_entry_is_stale_once_a_source_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("_ARGCOMPLETE", raising=False)
    source = tmp_path / "module.py"
    source.write_text("HELP = 'old'\n")
    help_cache.store({"": "old help\n"}, [str(source)])
    assert help_cache.cached_help(["--help"]) == "old help\n"
    stat = source.stat()
    source.write_text("HELP = 'new'\n")  # same size: the mtime tells
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert help_cache.cached_help(["--help"]) is None
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert help_cache.cached_help(["--help"]) == "old help\n"  # the same (mtime, size) as stored
    source.write_text("HELP = 'newer'\n")  # another size
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert help_cache.cached_help(["--help"]) is None
    source.unlink()
    assert help_cache.cached_help(["--help"]) is None


def test_every_loaded_clusterkit_module_is_a_source(tmp_path: Path) -> None:
    """What the entry is checked against: each module the parser was built from, and argparse."""
    import argparse

    import clusterkit.cli.examples
    import clusterkit.cli.parser

    sources = set(help_cache.loaded_sources())
    assert {clusterkit.cli.examples.__file__, clusterkit.cli.parser.__file__, argparse.__file__} <= sources
    assert all(Path(source).is_file() for source in sources)


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", b"\xe3\x01\x02", "marshal of another shape"])
def test_a_damaged_entry_means_the_parser(damage: bytes | str, tmp_path: Path) -> None:
    expected, _, _ = _help(tmp_path, "render", "--help")
    (entry,) = (tmp_path / "clusterkit").glob("help-*")
    if isinstance(damage, str):
        import marshal

        damage = marshal.dumps({"key": None, "texts": ["not", "a", "dict"], "sources": 3})
    entry.write_bytes(damage)
    assert _help(tmp_path, "render", "--help") == (expected, 0, True)
    assert _help(tmp_path, "render", "--help") == (expected, 0, False)  # written again, whole


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_an_entry_others_could_have_written_is_not_read(mode: int, tmp_path: Path) -> None:
    expected, _, _ = _help(tmp_path, "plan", "--help")
    (entry,) = (tmp_path / "clusterkit").glob("help-*")
    entry.chmod(mode)
    assert _help(tmp_path, "plan", "--help") == (expected, 0, True)
    assert entry.stat().st_mode & 0o777 == 0o600  # and replaced by one of its own
    assert _help(tmp_path, "plan", "--help") == (expected, 0, False)


@pytest.mark.parametrize("cache", ["a file", "a read-only folder", "no home"])
def test_a_cache_that_cannot_be_written_costs_time_only(cache: str, tmp_path: Path) -> None:
    expected = _argparse_help("ls", "--help")
    env: dict[str, str] = {}
    if cache == "a file":
        folder = tmp_path / "file"
        folder.write_text("")
    elif cache == "a read-only folder":
        folder = tmp_path / "ro"
        (folder / "clusterkit").mkdir(parents=True)
        (folder / "clusterkit").chmod(0o500)
        if os.access(folder / "clusterkit", os.W_OK):  # root writes into it anyway: /proc takes no folder from anyone
            folder = Path("/proc")
    else:
        folder = Path("relative")  # not absolute: the XDG spec ignores it, and there is no home either
        env = {"HOME": "relative"}
    for _ in range(2):
        assert _help(folder, "ls", "--help", **env) == (expected, 0, True)


def test_what_the_cache_does_not_answer_argparse_does(tmp_path: Path) -> None:
    _help(tmp_path, "--help")  # every command's help is stored
    assert _help(tmp_path, "-h", "validate") == (_argparse_help("--help"), 0, True)
    text, code, built = _help(tmp_path, "nosuch", "--help")
    assert (text, code, built) == ("", 2, True)
    text, code, built = _help(tmp_path, "validate", "--json", "--help")
    assert (code, built) == (0, True) and text.startswith("usage: clusterkit validate")
    # the shell asking for completions is argcomplete's, never an entry's
    assert help_cache.help_request(["validate", "--help"]) == "validate"
    os.environ["_ARGCOMPLETE"] = "1"
    try:
        assert help_cache.cached_help(["validate", "--help"]) is None
    finally:
        del os.environ["_ARGCOMPLETE"]


def test_concurrent_first_helps_all_print_the_help_and_leave_one_whole_entry(tmp_path: Path) -> None:
    expected = _argparse_help("status", "--help")
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _help(tmp_path, "status", "--help"), range(8)))
    assert all(text == expected and code == 0 for text, code, _ in results)
    assert [path.name for path in (tmp_path / "clusterkit").iterdir() if path.name.endswith(".tmp")] == []
    assert _help(tmp_path, "status", "--help") == (expected, 0, False)

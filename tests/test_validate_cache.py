"""``clusterkit validate`` answered from the validation cache (clusterkit.cli.validate_cache): a replay
prints exactly what validating printed, with its status, and never once anything the validation
read has changed: a recipe or a base edited in place with its mtime put back, a profile appearing
earlier on the search path, an environment variable, a re-pointed link, a recipe added to a folder,
another folder to run in, a package installed on sys.path. Runs that a record cannot cover store
nothing; damaged or foreign entries are not read. Every run is a real process (``python -c`` calling
the entry point as the console script does); its last stderr line says whether it validated (PyYAML
imported) or replayed.

The recipes are written once, then the module waits out RACY_SECONDS: files changed just before a
validation are never recorded (a file system's timestamps cannot tell two writes that close apart)."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clusterkit.cli.validate_cache import KEEP_ENTRIES, RACY_SECONDS
from clusterkit.spec.user_cache import read_private

PROBE = ("import sys\nfrom clusterkit.cli.main import main\ncode = main()\nsys.stdout.flush()\n"
         "sys.stderr.write(f'\\n{code} {\"validated\" if \"yaml\" in sys.modules else \"replayed\"}')\nsys.exit(code)")

BASE = """\
launcher: torchrun
resources: {nodes: 2, gpus_per_node: 2, cpus_per_task: 2, time: "00:10:00"}
parallelism: {micro_batch_size: 4, gradient_accumulation_steps: 1}
task:
  trainer:
    model: {config: {model_type: gpt2, n_layer: 2, n_head: 4, n_embd: 64, n_positions: 64, vocab_size: 512}}
    dataset: {type: synthetic, seq_len: 64, num_samples: 512}
    args: {max_steps: 2, learning_rate: 0.001}
"""
CASES = ("replays", "recipe", "base", "profile", "env", "link", "folder", "sys.path", "cwd", "no-cache",
         "snapshot", "pipe", "damaged-0", "damaged-1", "damaged-2", "damaged-3", "foreign-0", "foreign-1",
         "concurrent", "prune", "broken-pipe", "terminal", "refused-hook", "odd-name", "unwritable", "killed")


ODD_NAME = "-a b\n~%.yaml"  # a leading dash, a space, a line break, a tilde and a percent


def _write_case(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "base.yaml").write_text(BASE)
    (folder / "recipe.yaml").write_text("extends: base.yaml\nname: cached\ncluster: dev\n")
    (folder / "other.yaml").write_text("extends: base.yaml\nname: other\ncluster: dev\n# an edit keeps this size\n")
    (folder / "link.yaml").symlink_to("recipe.yaml")
    (folder / "libs").mkdir()


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder of recipes per test, and a cache folder whose derived entries (the TrainingArguments
    names) exist already; all older than RACY_SECONDS."""
    root = tmp_path_factory.mktemp("validate-cache")
    folders = {name: root / name for name in CASES}
    for folder in folders.values():
        _write_case(folder)
    scripted = folders["snapshot"] / "scripted"
    scripted.mkdir()
    (scripted / "train.py").write_text("print('a script of the user')\n")
    (scripted / "script.yaml").write_text("name: scripted\ncluster: dev\nlauncher: torchrun\n"
                                          "resources: {nodes: 1, gpus_per_node: 1, time: '00:10:00'}\n"
                                          "task: {script: train.py}\n")
    (folders["odd-name"] / ODD_NAME).write_text((folders["odd-name"] / "recipe.yaml").read_text())
    (folders["env"] / "elsewhere").mkdir()
    (folders["env"] / "elsewhere" / "dev.yaml").write_text("partition: [unclosed\n")
    _validate(folders["replays"], "--no-cache", "recipe.yaml")  # writes the cache's other entries
    time.sleep(RACY_SECONDS + 0.2)
    return folders


def _cache(case: Path) -> Path:
    return case.parent / "cache"


def _validate(case: Path, *argv: str, cwd: Path | None = None, stdin: str | None = None,
              **env: str) -> tuple[int, str, str, str]:
    """Status, stdout, stderr of ``clusterkit validate ARGV`` run in ``case`` (or ``cwd``), and
    whether it "validated" or "replayed"."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(_cache(case)), **env}
    environment.pop("CLUSTERKIT_CLUSTERS", None) if "CLUSTERKIT_CLUSTERS" not in env else None
    done = subprocess.run([sys.executable, "-c", PROBE, "validate", *argv], cwd=cwd or case, env=environment,
                          capture_output=True, text=True, input=stdin, timeout=120)
    stderr, _, last = done.stderr.rpartition("\n")
    code, how = last.split()
    assert int(code) == done.returncode
    return done.returncode, done.stdout, stderr, how


def _stored_then_replayed(case: Path, *argv: str, **env: str) -> tuple[int, str, str]:
    """Validate twice: the first run validates (and stores), the second replays it exactly."""
    code, out, err, how = _validate(case, *argv, **env)
    assert how == "validated"
    assert _validate(case, *argv, **env) == (code, out, err, "replayed")
    return code, out, err


def _edit_in_place(path: Path, old: str, new: str) -> None:
    """Rewrite ``path`` with ``old`` replaced by ``new`` (same length), its mtime put back."""
    assert len(old) == len(new)
    before = path.stat()
    text = path.read_text()
    assert old in text
    with path.open("r+") as file:  # the same inode, as an editor writing in place leaves it
        file.write(text.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("argv", [("recipe.yaml",), ("-q", "recipe.yaml"), ("--json", "recipe.yaml"),
                                  (".",), ("--json", "."), ("--set", "resources.nodes=0", "recipe.yaml"),
                                  ("missing.yaml",)])
def test_a_replay_prints_what_validating_printed(cases: dict[str, Path], argv: tuple[str, ...]) -> None:
    code, out, err = _stored_then_replayed(cases["replays"], *argv)
    if "resources.nodes=0" in argv or "missing.yaml" in argv:
        assert code == 2 and err  # a recipe's errors are replayed too, with their status
    else:
        assert code == 0 and (out or "-q" in argv)


def test_interleaved_output_is_replayed_in_order(cases: dict[str, Path]) -> None:
    """Warnings (stderr) and results (stdout) of a folder, on one pipe as a terminal shows them."""
    case = cases["replays"]
    command = [sys.executable, "-m", "clusterkit", "validate", ".", "--set", "task.trainer.args.bogus_flag=1"]
    env = {**os.environ, "XDG_CACHE_HOME": str(_cache(case))}

    def run() -> bytes:
        return subprocess.run(command, cwd=case, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=120).stdout

    first = run()
    assert first and run() == first


def test_an_entry_holds_no_environment_value(cases: dict[str, Path]) -> None:
    """Variables are kept as digests (some hold secrets); ``COLUMNS`` is one validate reads."""
    _stored_then_replayed(cases["replays"], "recipe.yaml", COLUMNS="4242")
    entries = [marshal.loads(path.read_bytes()) for path in (_cache(cases["replays"]) / "clusterkit").glob("validate-*")]
    (entry,) = [entry for entry in entries if any(name == "COLUMNS" and value is not None
                                                  for name, value in entry["environment"])
                and "recipe.yaml" in entry["key"][5]]  # the arguments
    assert all(value is None or (isinstance(value, bytes) and len(value) == 16) for _, value in entry["environment"])
    assert b"4242" not in marshal.dumps(entry)


def test_a_recipe_edited_in_place_with_its_mtime_put_back_is_validated_again(cases: dict[str, Path]) -> None:
    case = cases["recipe"]
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0
    _edit_in_place(case / "recipe.yaml", "cluster: dev", "cluster: dex")
    code, _, err, how = _validate(case, "recipe.yaml")
    assert (code, how) == (2, "validated") and "no cluster profile 'dex'" in err


def test_an_edited_base_is_validated_again(cases: dict[str, Path]) -> None:
    case = cases["base"]
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0
    _edit_in_place(case / "base.yaml", "nodes: 2", "nodes: 0")
    code, _, err, how = _validate(case, "recipe.yaml")
    assert (code, how) == (2, "validated") and "base.yaml" in err and "nodes" in err


def test_a_profile_appearing_earlier_on_the_search_path_is_used(cases: dict[str, Path]) -> None:
    """``cluster: dev`` came from the shipped profiles; one beside the recipe wins once it exists."""
    case = cases["profile"]
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0
    (case / "clusters").mkdir()
    (case / "clusters" / "dev.yaml").write_text("partition: [unclosed\n")
    code, _, err, how = _validate(case, "recipe.yaml")
    assert (code, how) == (2, "validated") and "clusters/dev.yaml" in err


def test_an_environment_variable_read_is_part_of_the_record(cases: dict[str, Path]) -> None:
    case = cases["env"]
    elsewhere = case / "elsewhere"
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0
    code, _, err, how = _validate(case, "recipe.yaml", CLUSTERKIT_CLUSTERS=str(elsewhere))
    assert (code, how) == (2, "validated") and "elsewhere/dev.yaml" in err
    assert _validate(case, "recipe.yaml", CLUSTERKIT_CLUSTERS=str(elsewhere))[::3] == (2, "replayed")
    assert _validate(case, "recipe.yaml")[::3] == (0, "validated")  # an entry per request: the latest run's


def test_a_re_pointed_link_is_validated_again(cases: dict[str, Path]) -> None:
    case = cases["link"]
    (case / "broken.yaml").write_text("extends: base.yaml\nname: cached\ncluster: dex\n")
    time.sleep(RACY_SECONDS + 0.1)
    assert _stored_then_replayed(case, "link.yaml")[0] == 0
    (case / "link.yaml").unlink()
    (case / "link.yaml").symlink_to("broken.yaml")
    code, _, err, how = _validate(case, "link.yaml")
    assert (code, how) == (2, "validated") and "dex" in err


def test_a_recipe_added_to_a_folder_is_counted(cases: dict[str, Path]) -> None:
    case = cases["folder"]
    code, out, _ = _stored_then_replayed(case, ".")
    assert code == 0 and "3 of 3 recipes valid (1 base file skipped)" in out
    (case / "new.yaml").write_text("extends: base.yaml\nname: new\ncluster: dex\n")
    code, out, _, how = _validate(case, ".")
    assert (code, how) == (2, "validated") and "3 of 4 recipes valid" in out


def test_a_package_installed_on_sys_path_is_used(cases: dict[str, Path]) -> None:
    """An install changes its folder: here a package named yaml that shadows PyYAML."""
    case = cases["sys.path"]
    libs = str(case / "libs")
    assert _stored_then_replayed(case, "recipe.yaml", PYTHONPATH=libs)[0] == 0
    (case / "libs" / "yaml").mkdir()
    (case / "libs" / "yaml" / "__init__.py").write_text("raise ImportError('a shadowing yaml')\n")
    done = subprocess.run([sys.executable, "-m", "clusterkit", "validate", "recipe.yaml"], cwd=case,
                          env={**os.environ, "XDG_CACHE_HOME": str(_cache(case)), "PYTHONPATH": libs},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "a shadowing yaml" in done.stderr


def test_the_same_words_in_another_folder_are_another_validation(cases: dict[str, Path]) -> None:
    case = cases["cwd"]
    other = case / "sub"
    other.mkdir()
    (other / "base.yaml").write_text(BASE.replace("nodes: 2", "nodes: 0"))
    (other / "recipe.yaml").write_text((case / "recipe.yaml").read_text())
    time.sleep(RACY_SECONDS + 0.1)
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0
    code, _, err, how = _validate(case, "recipe.yaml", cwd=other)
    assert (code, how) == (2, "validated") and "nodes" in err


def test_no_cache_validates_and_keeps_nothing(cases: dict[str, Path]) -> None:
    case = cases["no-cache"]
    for argv in (("--no-cache", "recipe.yaml"), ("--no-cache", "recipe.yaml"), ("recipe.yaml", "--no-c")):
        assert _validate(case, *argv)[::3] == (0, "validated")  # --no-c: argparse's abbreviation
    _stored_then_replayed(case, "recipe.yaml")


def test_a_validation_that_ran_git_is_not_kept(cases: dict[str, Path]) -> None:
    """A script's snapshot asks git for the work tree: what git reads is not recorded."""
    case = cases["snapshot"]
    for _ in range(2):
        code, _, _, how = _validate(case, "script.yaml", cwd=case / "scripted")
        assert (code, how) == (0, "validated")


def test_a_recipe_read_from_a_pipe_is_not_kept(cases: dict[str, Path]) -> None:
    """A pipe's status does not change with what flows through it."""
    case = cases["pipe"]
    text = (case / "recipe.yaml").read_text().replace("base.yaml", str(case / "base.yaml"))
    assert _validate(case, "/dev/stdin", stdin=text)[::3] == (0, "validated")
    code, _, err, how = _validate(case, "/dev/stdin", stdin=text.replace("cluster: dev", "cluster: dex"))
    assert (code, how) == (2, "validated") and "dex" in err


def test_files_changed_just_before_are_not_kept(cases: dict[str, Path]) -> None:
    """Within RACY_SECONDS of a write, a second write of the same size can leave the same status."""
    case = cases["recipe"].parent / "racy"
    _write_case(case)
    for _ in range(2):
        assert _validate(case, "recipe.yaml")[::3] == (0, "validated")


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", b"\xe3\x01\x02", "marshal of another shape"])
def test_a_damaged_entry_is_not_read(cases: dict[str, Path], damage: bytes | str) -> None:
    index = [b"", b"\x00garbage", b"\xe3\x01\x02", "marshal of another shape"].index(damage)
    case = cases[f"damaged-{index}"]
    before = set((_cache(case) / "clusterkit").glob("validate-*"))
    expected = _stored_then_replayed(case, "recipe.yaml")
    (entry,) = set((_cache(case) / "clusterkit").glob("validate-*")) - before
    if isinstance(damage, str):
        damage = marshal.dumps({"key": None, "paths": 3, "environment": "x", "output": [(7, 1)], "status": "0"})
    entry.write_bytes(damage)
    assert _validate(case, "recipe.yaml") == (*expected, "validated")


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_an_entry_others_could_have_written_is_not_read(cases: dict[str, Path], mode: int) -> None:
    case = cases[f"foreign-{[0o620, 0o602].index(mode)}"]
    before = set((_cache(case) / "clusterkit").glob("validate-*"))
    expected = _stored_then_replayed(case, "recipe.yaml")
    (entry,) = set((_cache(case) / "clusterkit").glob("validate-*")) - before
    entry.chmod(mode)
    assert _validate(case, "recipe.yaml") == (*expected, "validated")


def test_an_entry_of_another_user_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = tmp_path / "validate-entry"
    entry.write_bytes(b"ours")
    entry.chmod(0o600)
    assert read_private(str(entry)) == b"ours"
    monkeypatch.setattr(os, "getuid", lambda: entry.stat().st_uid + 1)
    assert read_private(str(entry)) is None


def test_concurrent_first_validations_agree_and_leave_a_whole_entry(cases: dict[str, Path]) -> None:
    case = cases["concurrent"]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: _validate(case, "recipe.yaml")[:3], range(8)))
    assert len(set(results)) == 1 and results[0][0] == 0
    assert _validate(case, "recipe.yaml") == (*results[0], "replayed")
    assert not list((_cache(case) / "clusterkit").glob("*.tmp"))


def test_the_oldest_entries_go_beyond_the_limit(cases: dict[str, Path]) -> None:
    case = cases["prune"]
    cache = _cache(case) / "clusterkit"
    old = time.time() - 3600
    for number in range(KEEP_ENTRIES + 20):
        stale = cache / f"validate-stale{number:04d}"
        stale.write_bytes(b"")
        os.utime(stale, (old, old))
    _stored_then_replayed(case, "recipe.yaml")
    assert len(list(cache.glob("validate-*"))) == KEEP_ENTRIES
    assert len(list(cache.glob("validate-stale*"))) < KEEP_ENTRIES
    for stale in cache.glob("validate-stale*"):
        stale.unlink()


def test_a_replay_into_a_closed_pipe_ends_quietly(cases: dict[str, Path]) -> None:
    case = cases["broken-pipe"]
    _stored_then_replayed(case, "--json", ".")
    process = subprocess.Popen([sys.executable, "-m", "clusterkit", "validate", "--json", "."], cwd=case,
                               env={**os.environ, "XDG_CACHE_HOME": str(_cache(case))},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before it writes: `clusterkit validate --json . | true`
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1 and "Traceback" not in stderr, stderr


def test_submit_does_not_read_the_cache(cases: dict[str, Path]) -> None:
    """A dry-run submit after a stored validation validates (the cache is validate's alone)."""
    case = cases["replays"]
    _stored_then_replayed(case, "recipe.yaml")
    probe = PROBE.replace('"yaml" in sys.modules', '"clusterkit.load.loader" in sys.modules')
    done = subprocess.run([sys.executable, "-c", probe, "submit", "recipe.yaml", "--executor", "local", "--dry-run"],
                          cwd=case, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_CACHE_HOME": str(_cache(case))})
    assert done.returncode == 0 and done.stderr.endswith("0 validated"), done.stderr


def test_a_validation_on_a_terminal_is_replayed_on_the_same_terminal(cases: dict[str, Path]) -> None:
    """stdout and stderr a terminal (a pseudo-terminal here), as in an interactive shell: its size is
    part of the request, and what was printed comes back the same."""
    import pty

    case = cases["terminal"]
    env = {**os.environ, "XDG_CACHE_HOME": str(_cache(case))}

    def run() -> tuple[int, bytes, str]:
        controller, terminal = pty.openpty()
        done = subprocess.run([sys.executable, "-c", PROBE, "validate", "recipe.yaml", "--set", "task.trainer.args.bogus=1"],
                              cwd=case, env=env, stdout=terminal, stderr=terminal, timeout=120)
        os.close(terminal)
        printed = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other side is closed and everything was read
                break
            if not chunk:
                break
            printed += chunk
        os.close(controller)
        text, _, how = printed.rpartition(b"\n")
        return done.returncode, text, how.decode().split()[-1]

    first = run()
    assert first[0] == 2 and b"bogus" in first[1] and first[2] == "validated"  # an unknown TrainingArguments name
    assert run() == (*first[:2], "replayed")


def test_a_run_whose_audit_hook_was_refused_keeps_nothing(cases: dict[str, Path]) -> None:
    """A program's own audit hook may refuse further hooks, and sys.addaudithook then returns
    quietly: without its hook a run cannot see what it reads, so it stores nothing."""
    case = cases["refused-hook"]
    refuse = ("import sys\ndef hook(event, args):\n    if event == 'sys.addaudithook':\n"
              "        raise RuntimeError('no more hooks')\nsys.addaudithook(hook)\n")
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", refuse + PROBE, "validate", "recipe.yaml"], cwd=case,
                              env={**os.environ, "XDG_CACHE_HOME": str(_cache(case))}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and done.stderr.endswith("0 validated"), done.stderr
    assert _stored_then_replayed(case, "recipe.yaml")[0] == 0  # the same request without that hook


def test_a_file_name_with_a_line_break_and_shell_characters_is_replayed_as_printed(cases: dict[str, Path]) -> None:
    code, out, _ = _stored_then_replayed(cases["odd-name"], f"./{ODD_NAME}")
    assert code == 0 and out == f"{ODD_NAME}: ok\n"


@pytest.mark.parametrize("cache", ["a file", "a folder no one can write to", "no home"])
def test_a_cache_that_cannot_be_written_costs_time_only(cases: dict[str, Path], cache: str) -> None:
    case = cases["unwritable"]
    # /proc takes no folder, not even from root; relative: the XDG spec ignores it, and no home either
    env = {"a file": {"XDG_CACHE_HOME": str(case / "recipe.yaml")}, "a folder no one can write to": {"XDG_CACHE_HOME": "/proc"},
           "no home": {"XDG_CACHE_HOME": "relative", "HOME": "relative"}}[cache]
    expected = _validate(case, "--no-cache", "recipe.yaml")[:3]
    for _ in range(2):
        environment = {**os.environ, **env}
        done = subprocess.run([sys.executable, "-c", PROBE, "validate", "recipe.yaml"], cwd=case, env=environment,
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == (expected[0], expected[1], expected[2] + "\n0 validated")


def test_runs_killed_at_any_moment_never_leave_an_entry_that_replays_wrongly(cases: dict[str, Path]) -> None:
    """kill -9 while validating, recording or writing the entry: an entry is written whole and
    renamed, so the next runs print what validating prints."""
    import random

    case = cases["killed"]
    expected = _validate(case, "--no-cache", ".")[:3]
    env = {**os.environ, "XDG_CACHE_HOME": str(_cache(case))}
    for delay in [random.uniform(0.05, 0.6) for _ in range(8)]:
        process = subprocess.Popen([sys.executable, "-c", PROBE, "validate", "."], cwd=case, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        process.kill()
        process.wait()
    assert _validate(case, ".")[:3] == expected
    assert _validate(case, ".") == (*expected, "replayed")

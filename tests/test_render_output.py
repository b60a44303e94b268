"""`render -o` never deletes or moves anything clusterkit did not write: a new or empty directory is
filled, an earlier render is replaced whole (readers never see it missing), anything else is refused
with one line and exit 2, leaving every byte as it was."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from clusterkit.errors import OutputDirError
from clusterkit.render import output_dir as render_dir
from clusterkit.render.output_dir import MARKER
from conftest import REPO, run_cli

TINY = REPO / "recipes" / "tiny-gpt2-cpu.yaml"
RENDERED = {"job.sbatch", "env.sh", "recipe.resolved.yaml", "job.json", "plan.json", "supervisor", MARKER}


def _render(out: Path | str, cwd: Path | None = None):
    return run_cli("render", str(TINY), "-o", str(out), cwd=cwd)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_new_directory_and_rerender(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    assert _render(out).returncode == 0
    assert set(os.listdir(out)) == RENDERED
    first = (out / "job.sbatch").read_bytes()
    done = _render(out)
    assert done.returncode == 0, done.stderr
    assert (out / "job.sbatch").read_bytes() == first
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"], "no staging or old directories left"


@pytest.mark.parametrize("what", ["project", "recipe-folder", "cwd"])
def test_a_folder_that_is_not_a_render_is_refused_untouched(tmp_path: Path, what: str) -> None:
    folder = tmp_path / "project"
    (folder / "src").mkdir(parents=True)
    (folder / "train.py").write_text("print('mine')\n")
    (folder / "src" / "model.py").write_text("x = 1\n")
    (folder / "recipe.yaml").write_text(TINY.read_text())
    before = _tree(folder)
    if what == "cwd":
        done = run_cli("render", str(TINY), "-o", ".", cwd=folder)
    elif what == "recipe-folder":
        done = run_cli("render", str(folder / "recipe.yaml"), "-o", str(folder))
    else:
        done = _render(folder)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "never deletes what it did not write" in done.stderr
    assert _tree(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"], "nothing staged beside it"


def test_an_earlier_render_with_a_users_file_in_it_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _render(out).returncode == 0
    (out / "notes.txt").write_text("my notes")
    done = _render(out)
    assert done.returncode == 2 and "notes.txt" in done.stderr and "did not write" in done.stderr
    assert (out / "notes.txt").read_text() == "my notes"


def test_a_file_path_is_refused_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "report.txt"
    target.write_text("precious")
    done = _render(target)
    assert done.returncode == 2 and "is not a directory" in done.stderr
    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"], "no .report.txt.old.* or staging"


def test_an_empty_directory_and_dot_are_filled_in_place(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = empty.stat().st_ino
    assert run_cli("render", str(TINY), "-o", ".", cwd=empty).returncode == 0
    assert set(os.listdir(empty)) == RENDERED and empty.stat().st_ino == inode


def test_a_symlink_to_a_folder_renders_into_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert _render(tmp_path / "link").returncode == 0 and _render(tmp_path / "link").returncode == 0
    assert (tmp_path / "link").is_symlink() and set(os.listdir(target)) == RENDERED


def test_replacing_a_render_never_leaves_it_missing(tmp_path: Path) -> None:
    """A reader polling job.sbatch during 30 re-renders always finds it whole (RENAME_EXCHANGE)."""
    from clusterkit import load_recipe, render_job

    files = render_job(load_recipe(TINY)).files
    out = tmp_path / "out"
    render_dir.write_render(files, out, "test")
    expected = files["job.sbatch"]
    misses: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                if (out / "job.sbatch").read_text() != expected:
                    misses.append("torn")
            except FileNotFoundError:
                misses.append("missing")

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(30):
            render_dir.write_render(files, out, "test")
    finally:
        stop.set()
        reader.join()
    assert misses == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError(28, "No space left on device")])
@pytest.mark.parametrize("state", ["new", "empty", "earlier-render"])
def test_a_failure_midway_leaves_the_target_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: BaseException, state: str
) -> None:
    from clusterkit import load_recipe, render_job

    files = render_job(load_recipe(TINY)).files
    out = tmp_path / "out"
    if state == "empty":
        out.mkdir()
    elif state == "earlier-render":
        render_dir.write_render({**files, "job.sbatch": "old\n"}, out, "test")
    before = _tree(tmp_path)
    calls = []
    real_write = render_dir._write_file

    def failing_write(path: Path, text: str) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise interrupt
        real_write(path, text)

    monkeypatch.setattr(render_dir, "_write_file", failing_write)
    expected = KeyboardInterrupt if interrupt is KeyboardInterrupt else OutputDirError
    with pytest.raises(expected) as caught:
        render_dir.write_render(files, out, "test")
    if expected is OutputDirError:
        assert str(caught.value) == f"cannot write the render to {out}: No space left on device"
    assert _tree(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if state == "new" else ["out"])


def test_permission_and_name_errors_are_one_line(tmp_path: Path) -> None:
    done = _render(tmp_path / ("x" * 300))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "File name too long" in done.stderr and "Traceback" not in done.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = _render(blocker / "sub")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"clusterkit: cannot write the render to {blocker}/sub: ")

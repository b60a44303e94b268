"""The private user cache (spec/user_cache.py) below the caches that use it: what it writes, how
much it reads, Ctrl-C in a write, and a cache folder that is a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterkit.spec import user_cache


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_entry_is_written_private_and_read_back(cache_home: Path) -> None:
    user_cache.write_entry("sub/deeper", "entry", b"data")
    assert user_cache.read_entry("sub/deeper", "entry") == b"data"
    entry = cache_home / "clusterkit" / "sub" / "deeper" / "entry"
    assert [oct(p.stat().st_mode & 0o777) for p in (entry.parents[2], entry.parents[1], entry.parent, entry)] == [
        "0o700",
        "0o700",
        "0o700",
        "0o600",
    ]


def test_an_entry_larger_than_the_bound_is_not_read(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_cache, "MAX_ENTRY_BYTES", 4)
    user_cache.write_entry("", "small", b"1234")
    user_cache.write_entry("", "large", b"12345")
    assert (user_cache.read_entry("", "small"), user_cache.read_entry("", "large")) == (b"1234", None)


def test_ctrl_c_in_a_write_leaves_the_old_entry_and_no_temporary_file(
    cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_cache.write_entry("", "entry", b"old")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        user_cache.write_entry("", "entry", b"new")
    assert [p.name for p in (cache_home / "clusterkit").iterdir()] == ["entry"]
    assert user_cache.read_entry("", "entry") == b"old"


def test_a_cache_root_that_links_to_a_private_folder_of_ours_is_used(cache_home: Path, tmp_path: Path) -> None:
    """A home or cache moved to a larger disk: the link is followed to the root, checked as what it leads to."""
    (tmp_path / "scratch").mkdir(mode=0o700)
    cache_home.mkdir()
    (cache_home / "clusterkit").symlink_to(tmp_path / "scratch")
    user_cache.write_entry("", "entry", b"data")
    assert user_cache.read_entry("", "entry") == b"data" and (tmp_path / "scratch" / "entry").is_file()


@pytest.mark.parametrize("home", ["", "relative/home"])
def test_no_home_means_no_cache(home: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", home)
    if not home:
        monkeypatch.delenv("HOME")
        monkeypatch.setattr(os.path, "expanduser", lambda path: path)  # no passwd entry either
    assert user_cache.user_cache_dir() is None
    user_cache.write_entry("", "entry", b"data")  # nothing, and no error
    assert user_cache.read_entry("", "entry") is None

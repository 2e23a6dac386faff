"""fsguard.gitscan: a remembered walk finds what a full walk finds, also what changed since, however it changed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fsguard import gitguard, gitscan
from fsguard.policy import GIT_DIR_PROTECT


def repo(d: Path) -> Path:
    """A minimal git directory as git's own test sees one (HEAD, refs/, objects/)."""
    g = d / ".git"
    (g / "refs").mkdir(parents=True)
    (g / "objects").mkdir()
    (g / "hooks").mkdir()
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    return g


def tree(root: Path, n: int = 30) -> None:
    for i in range(n):
        (root / f"d{i}" / "sub").mkdir(parents=True)
    repo(root)


def found(root: Path, cache: Path | None, listed: list[str] | None = None) -> set[tuple[str, str]]:
    def listing(d: str) -> tuple[bool, list[str], list[tuple[str, str]]] | None:
        if listed is not None:
            listed.append(d)
        return gitguard._listing(d)

    out = set()
    for item in gitscan.walk(str(root), listing, str(cache) if cache else None, 10_000):
        assert item is not None
        out.add(item)
    return out


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories made by the test count as settled (the real slack is 2 s); each change below comes
    after a pause longer than the kernel's timestamp tick, as any later change does."""
    monkeypatch.setattr(gitscan, "CTIME_SLACK_NS", 0)


def pause() -> None:
    time.sleep(0.05)


def test_the_second_walk_lists_only_what_changed_and_finds_the_same(tmp_path: Path, settled: None) -> None:
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    tree(ws)
    first: list[str] = []
    full = found(ws, None)
    assert found(ws, cache, first) == full == {("dir", str(ws / ".git"))}
    again: list[str] = []
    assert found(ws, cache, again) == full
    assert len(first) == 61 and again == []  # every directory stat()ed, none listed
    pause()
    nested = repo(ws / "d7" / "sub")  # a repository appears deep in the tree
    again.clear()
    assert found(ws, cache, again) == {*full, ("dir", str(nested))}
    assert again == [str(ws / "d7" / "sub")]  # only the directory that changed is listed again


def test_a_forged_mtime_does_not_hide_a_new_repository(tmp_path: Path, settled: None) -> None:
    """The sandbox can set a directory's mtime back (utimensat), never its ctime."""
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    tree(ws, 3)
    found(ws, cache)
    pause()
    d = ws / "d1"
    st = os.stat(d)
    (d / ".git").write_text("gitdir: ../../elsewhere\n")  # a .git file: git follows it
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(d).st_mtime_ns == st.st_mtime_ns
    assert ("file", str(d / ".git")) in found(ws, cache)


def test_a_directory_swapped_for_a_symlink_or_a_git_dir_for_a_file_is_seen(tmp_path: Path, settled: None) -> None:
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    tree(ws, 2)
    repo(ws / "d0")
    found(ws, cache)
    pause()
    os.rename(ws / "d0" / ".git", tmp_path / "moved")
    (ws / "d0" / ".git").symlink_to(tmp_path / "moved")
    assert ("link", str(ws / "d0" / ".git")) in found(ws, cache)
    # through the planner: a .git symlink is refused, with or without the cache
    names = {str(ws): [(r.rstrip("/"), r.endswith("/")) for r in GIT_DIR_PROTECT]}
    for cache_dir in (None, str(cache)):
        gitguard.SCAN_CACHE = cache_dir
        try:
            with pytest.raises(gitguard.GitGuardError):
                gitguard.plan(names)
        finally:
            gitguard.SCAN_CACHE = None


def test_recent_directories_are_not_remembered(tmp_path: Path) -> None:
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    tree(ws, 2)
    found(ws, cache)
    listed: list[str] = []
    found(ws, cache, listed)
    assert len(listed) == 5  # just made: within the slack of the kernel's coarse clock, never trusted


def test_a_damaged_cache_is_a_full_walk(tmp_path: Path, settled: None) -> None:
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    tree(ws, 2)
    found(ws, cache)
    (walk,) = cache.iterdir()
    walk.write_bytes(b"\x00garbage")
    listed: list[str] = []
    assert found(ws, cache, listed) == {("dir", str(ws / ".git"))} and len(listed) == 5


def test_the_planner_protects_the_same_paths_with_the_cache(tmp_path: Path, settled: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tree(ws, 5)
    names = {str(ws): [(r.rstrip("/"), r.endswith("/")) for r in GIT_DIR_PROTECT]}
    plain = gitguard.plan(names).protect
    gitguard.SCAN_CACHE = str(tmp_path / "cache")
    try:
        assert gitguard.plan(names).protect == plain
        assert gitguard.plan(names).protect == plain  # from the cache
        pause()
        inner = repo(ws / "d3")
        assert f"{inner}/hooks" in {p for p, _ in gitguard.plan(names).protect}
    finally:
        gitguard.SCAN_CACHE = None


def test_the_limit_still_stops_the_walk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tree(ws, 5)
    items = list(gitscan.walk(str(ws), gitguard._listing, str(tmp_path / "cache"), 3))
    assert items[-1] is None


def test_only_the_latest_walks_are_kept(tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gitscan, "MAX_WALKS", 2)
    cache = tmp_path / "cache"
    for i in range(4):
        ws = tmp_path / f"ws{i}"
        (ws / "d").mkdir(parents=True)
        found(ws, cache)
        time.sleep(0.01)
    kept = sorted(p.name.split(".")[0] for p in cache.iterdir())
    assert len(kept) == 2 and kept[-1].endswith("ws3") and kept[0].endswith("ws2")

r"""r5-new: the listing of links below a writable root reaches folders past MAX_PATH.

FindFirstFileW (os.scandir on Windows) fails on a plain path of MAX_PATH (260) or more unless the name
has the `\\?\` prefix or the machine opted in (LongPathsEnabled, off by default): "To specify an
extended-length path, use the "\\?\" prefix" (learn.microsoft.com/windows/win32/fileio/
maximum-file-path-limitation). The command can make a junction that deep inside the workspace; the ACL
walk that follows the run's grant has no such limit, so the listing must not skip it. The fake below
enforces that contract; a relative link target still resolves against the plain name.
"""

from __future__ import annotations

import ntpath
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fsguard.windows import reparse, win32reparse

ROOT = r"C:\W"
DEEP = ntpath.join(ROOT, *(["d" * 60] * 5))  # 310 characters: past MAX_PATH


@dataclass
class Entry:
    path: str
    kind: str  # "dir", "junction", "file"

    def is_symlink(self) -> bool:
        return False

    def is_junction(self) -> bool:
        return self.kind == "junction"

    def is_dir(self, follow_symlinks: bool = True) -> bool:
        return self.kind == "dir"


TREE = {ROOT: [("d" * 60, "dir")]}
for depth in range(1, 5):
    TREE[ntpath.join(ROOT, *(["d" * 60] * depth))] = [("d" * 60, "dir")]
TREE[DEEP] = [("evil", "junction"), ("ok", "junction")]
TARGETS = {"evil": "\\\\?\\C:\\Users\\me\\AppData\\Roaming\\Microsoft\\Windows\\Start Menu", "ok": "..\\x"}


def _plain(path: str) -> str:
    return path[4:] if path.startswith("\\\\?\\") else path


def fake_scandir(path: str) -> Iterator[Entry]:
    if not path.startswith("\\\\?\\") and len(path) + 2 >= 260:  # "path\*" past MAX_PATH: FindFirstFileW fails
        raise OSError(206, "The filename or extension is too long")
    for name, kind in TREE.get(_plain(path), []):
        yield Entry(path + "\\" + name, kind)


def fake_readlink(path: str) -> str:
    if not path.startswith("\\\\?\\") and len(path) >= 260:
        raise OSError(206, "The filename or extension is too long")
    return TARGETS[ntpath.basename(path)]


@pytest.fixture(autouse=True)
def _fs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.scandir", fake_scandir)
    monkeypatch.setattr("os.readlink", fake_readlink)


def test_a_junction_past_max_path_is_listed_and_refuses_the_run() -> None:
    links = win32reparse.walk(ROOT)
    assert {ntpath.basename(link.path) for link in links} == {"evil", "ok"}
    line = reparse.check(win32reparse.walk, (ROOT,))
    assert line is not None and "evil" in line and "Start Menu" in line


def test_listed_names_are_plain_so_a_relative_target_resolves_inside() -> None:
    (ok,) = [link for link in win32reparse.walk(ROOT) if link.path.endswith("ok")]
    assert ok.path == ntpath.join(DEEP, "ok")  # no \\?\ prefix: what the user sees and resolved() joins onto
    assert reparse.resolved(ok) == ntpath.join(ntpath.dirname(DEEP), "x")  # inside the root

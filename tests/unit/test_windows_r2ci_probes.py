r"""The ACL probes on a volume that compares names as NTFS does (issue 28, round two, r2-ci C2).

On Linux `.GIT/Config` is another, missing file, so the case-variant attack on the repository's config
failed and wrote nothing; on the Windows runner it IS `.git\config`, an unprotected folder lets it through,
and the probes claimed every attack that works is undone at once while this one was not (the workflow's
unit step then failed test_windows_aclguard's real-file test). Here a real folder is given NTFS's
case-insensitive names, so the attack works as it does there and must be undone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from selftest.windows import aclprobes, win32probefs


class CaseInsensitive(win32probefs.OsFsOps):
    """OsFsOps over a POSIX folder, each name matched case-insensitively to what exists (NTFS's rule:
    learn.microsoft.com/windows/win32/fileio/naming-a-file, "treat file names as case insensitive")."""

    def _real(self, path: str) -> str:
        if sys.platform == "win32":  # the workflow's unit step: NTFS itself compares names this way
            return path
        parts = [p for p in path.replace("\\", "/").split("/") if p]
        cur = "/"
        for part in parts:
            here = os.listdir(cur) if os.path.isdir(cur) else []
            cur = os.path.join(cur, next((n for n in here if n.casefold() == part.casefold()), part))
        return cur

    def read(self, path: str) -> bytes:
        return super().read(self._real(path))

    def write(self, path: str, data: bytes) -> None:
        super().write(self._real(path), data)

    def mkdir(self, path: str) -> None:
        super().mkdir(self._real(path))

    def rename(self, src: str, dst: str) -> None:
        super().rename(self._real(src), self._real(dst))

    def delete(self, path: str) -> None:
        super().delete(self._real(path))

    def is_dir(self, path: str) -> bool:
        return super().is_dir(self._real(path))

    def short_alias(self, path: str) -> str | None:
        return None  # GetShortPathNameW is Windows'


CONFIG = b"[core]\n\tbare = false\n"


def _repo(tmp_path: Path) -> Path:
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "config").write_bytes(CONFIG)
    return tmp_path


def test_an_overwrite_that_works_on_a_case_insensitive_volume_is_undone(tmp_path: Path) -> None:
    ws = _repo(tmp_path)
    rows = {r.name: r for r in aclprobes.probe_all(str(ws), CaseInsensitive())}
    line = next(x for x in rows["case_variant"].lines if "write .GIT\\Config" in x)
    assert line.startswith("FAIL") and "IT WORKED" in line and "could not undo" not in line  # it really wrote
    assert (ws / ".git" / "config").read_bytes() == CONFIG  # and put back what was there
    assert sorted(p.name for p in ws.iterdir()) == [".git"]


def test_the_old_attack_left_the_config_clobbered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the attack as it was (a write, no undo) changes the repository, so the test above bites."""
    monkeypatch.setattr(aclprobes, "_overwrite", lambda path: (aclprobes._write(path), None))
    ws = _repo(tmp_path)
    aclprobes.probe_all(str(ws), CaseInsensitive())
    assert (ws / ".git" / "config").read_bytes() == b"sandgate probe\n"


def test_an_unreadable_original_is_reported_not_guessed(tmp_path: Path) -> None:
    class NoRead(CaseInsensitive):
        def read(self, path: str) -> bytes:
            raise PermissionError(13, "read refused", path)

    ws = _repo(tmp_path)
    rows = {r.name: r for r in aclprobes.probe_all(str(ws), NoRead())}
    line = next(x for x in rows["case_variant"].lines if "write .GIT\\Config" in x)
    assert "IT WORKED" in line and "could not undo it" in line and "restore it by hand" in line


def test_the_body_script_carries_the_read(tmp_path: Path) -> None:
    """The verify body runs aclprobes' and win32probefs' source as one script: the read must be in it."""
    from selftest.windows import probeacl

    assert "def read(self, path: str) -> bytes:" in probeacl.SCRIPT and "def _overwrite(" in probeacl.SCRIPT

"""launcher.audit.logs: default logs are pruned by count, age and size, and only sandgate's own files go."""

from __future__ import annotations

import os
import time
from pathlib import Path

from launcher.audit import logs as auditlogs


def make(d: Path, name: str, age_days: float, size: int = 10) -> Path:
    p = d / name
    p.write_bytes(b"x" * size)
    t = time.time() - age_days * 86400
    os.utime(p, (t, t))
    return p


def test_prune_keeps_the_newest_and_drops_old_many_or_large(tmp_path: Path, monkeypatch: object) -> None:
    old = make(tmp_path, "audit-old.jsonl", auditlogs.KEEP_DAYS + 1)
    fresh = [make(tmp_path, f"audit-{i:04d}.jsonl", i / 1000) for i in range(auditlogs.KEEP_FILES + 5)]
    other = make(tmp_path, "notes.txt", 400)  # not ours: never touched
    removed = auditlogs.prune(tmp_path)
    assert old in removed and not old.exists() and other.exists()
    assert all(p.exists() for p in fresh[: auditlogs.KEEP_FILES]) and not any(p.exists() for p in fresh[-5:])
    assert auditlogs.latest(tmp_path) == fresh[0]
    assert [p for _, _, p in auditlogs.recent(tmp_path, 2)] == fresh[:2]


def test_prune_bounds_the_total_size(tmp_path: Path) -> None:
    big = auditlogs.KEEP_BYTES // 2 + 1
    a, b, c = (make(tmp_path, f"audit-{n}.jsonl", age, big) for n, age in (("a", 0.1), ("b", 0.2), ("c", 0.3)))
    auditlogs.prune(tmp_path)
    assert a.exists() and not b.exists() and not c.exists()


def test_a_symlink_named_like_a_log_is_never_followed_or_removed(tmp_path: Path) -> None:
    target = make(tmp_path, "keep-me", 400)
    (tmp_path / "audit-link.jsonl").symlink_to(target)
    auditlogs.prune(tmp_path, now=time.time() + 10**9)
    assert target.exists() and (tmp_path / "audit-link.jsonl").is_symlink()

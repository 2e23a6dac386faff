"""launcher.audit.logs: default logs are pruned by count, age and size, and only sandgate's own files go."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from launcher.audit import logs as auditlogs

from ..support.audit_records import empty_policy


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


# ---- pruning at most once an hour or every PRUNE_AFTER_RUNS logs (issue 25: not a scan per run) --------


def test_prune_runs_first_then_only_when_due_by_count_or_age(tmp_path: Path) -> None:
    now = time.time()
    old = make(tmp_path, "audit-old.jsonl", auditlogs.KEEP_DAYS + 1)
    assert auditlogs.prune_if_due(tmp_path, now) and not old.exists()  # no stamp yet: prune
    stamp = tmp_path / auditlogs.PRUNE_STAMP
    pruned_at = stamp.stat().st_mtime
    runs = 0
    while True:
        late = make(tmp_path, f"audit-late{runs}.jsonl", auditlogs.KEEP_DAYS + 1)
        due = auditlogs.prune_if_due(tmp_path, now + runs)
        runs += 1
        if due:
            break
        assert late.exists() and stamp.stat().st_mtime == pruned_at  # counted, the prune's time kept
    assert runs == auditlogs.PRUNE_AFTER_RUNS  # the bound: at most this many logs between prunes
    assert not any(tmp_path.glob("audit-late*"))
    assert not auditlogs.prune_if_due(tmp_path, now + runs)
    late = make(tmp_path, "audit-hour.jsonl", auditlogs.KEEP_DAYS + 1)
    assert auditlogs.prune_if_due(tmp_path, now + runs + auditlogs.PRUNE_EVERY) and not late.exists()


def test_a_stamp_that_cannot_be_kept_means_a_prune_every_time(tmp_path: Path) -> None:
    (tmp_path / auditlogs.PRUNE_STAMP).symlink_to(tmp_path / "elsewhere")  # never followed
    for _ in range(2):
        old = make(tmp_path, "audit-old.jsonl", auditlogs.KEEP_DAYS + 1)
        assert auditlogs.prune_if_due(tmp_path) and not old.exists()
    assert not (tmp_path / "elsewhere").exists()


def test_a_stamp_from_the_future_is_a_prune(tmp_path: Path) -> None:
    now = time.time()
    auditlogs.prune_if_due(tmp_path, now)
    os.utime(tmp_path / auditlogs.PRUNE_STAMP, (now + 86400, now + 86400))  # the clock was set back since
    assert auditlogs.prune_if_due(tmp_path, now + 1)


# ---- "the last run" is the last run of this workspace (issue 23) -----------------------------------


def write_run(
    d: Path, name: str, cwd: str | None, started: str, *, learn: bool = False, hosts: tuple[str, ...] = ()
) -> Path:
    """A log as a run writes it: its policy record first (naming its working directory), then decisions."""
    from netguard import audit

    path = d / f"audit-{name}.jsonl"
    log = audit.AuditLog(path)
    rec = empty_policy(name, cwd, learn)
    log.write({**rec, "ts": started})
    for i, host in enumerate(hosts):
        log.write(audit.decision_record(name, f"d{i}", "connect", "allow", host, 443, reason="allowed"))
    log.close()
    return path


def test_the_last_run_is_this_workspaces_even_when_another_wrote_later(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    a_old = write_run(logs, "a-old", "/w/a", "2030-01-01T00:00:00.000Z")
    a_new = write_run(logs, "a-new", "/w/a/sub", "2030-01-01T00:00:01.000Z")  # run from inside a
    write_run(logs, "b", "/w/b", "2030-01-01T00:00:02.000Z")  # another workspace, concurrent and later
    write_run(logs, "ab", "/w/ab", "2030-01-01T00:00:03.000Z")  # a sibling whose name starts alike
    write_run(logs, "old", None, "2030-01-01T00:00:04.000Z")  # an older sandgate's log: says no workspace
    make(logs, "audit-junk.jsonl", 0).write_text("not json\n")
    os.utime(a_old, (time.time() + 100, time.time() + 100))  # the newest file, but not the last run
    found = auditlogs.last_of_workspace("/w/a", logs)
    assert found is not None and found.path == a_new and found.cwd == "/w/a/sub" and found.task == "a-new"
    assert auditlogs.last_of_workspace("/w/b", logs).path == logs / "audit-b.jsonl"  # type: ignore[union-attr]
    assert auditlogs.last_of_workspace("/w/c", logs) is None
    assert auditlogs.last_of_workspace("/w/a/sub/deeper", logs).path == a_new  # type: ignore[union-attr]


def test_same_workspace_is_the_same_directory_or_one_inside_the_other() -> None:
    assert auditlogs.same_workspace("/w/a", "/w/a/") and auditlogs.same_workspace("/w/a/x", "/w/a")
    assert auditlogs.same_workspace("/w/a", "/w/a/x")  # the run could write where you stand
    assert not auditlogs.same_workspace("/w/ab", "/w/a") and not auditlogs.same_workspace("/w/a", "/w/b")


def _audit_cli(
    args: list[str], cwd: Path, logs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    from launcher import cli

    monkeypatch.setattr(auditlogs, "log_dir", lambda: logs)
    monkeypatch.chdir(cwd)
    try:
        code = cli.main(["audit", *args])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_and_suggest_with_no_log_read_this_workspaces_last_run_and_say_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logs, a, b = tmp_path / "logs", tmp_path / "a", tmp_path / "b"
    for d in (logs, a, b):
        d.mkdir()
    mine = write_run(logs, "in-a", str(a), "2030-01-01T00:00:00.000Z", hosts=("a.test",))
    write_run(logs, "in-b", str(b), "2030-01-01T00:00:05.000Z", hosts=("b.test",))  # newer, elsewhere
    code, out, err = _audit_cli(["summary"], a, logs, monkeypatch, capsys)
    assert code == 0 and "a.test" in out and "b.test" not in out, (out, err)
    assert err.splitlines() == [
        f"sandgate: reading the last run of {a} (task in-a, started 2030-01-01T00:00:00.000Z): {mine}"
    ]
    code, out, err = _audit_cli(["suggest"], b, logs, monkeypatch, capsys)
    assert code == 0 and "b.test" in out and "a.test" not in out and "in-b" in err, (out, err)
    code, out, err = _audit_cli(["summary", str(mine)], b, logs, monkeypatch, capsys)  # a named log: as named
    assert code == 0 and "a.test" in out and err == f"sandgate: reading {mine}\n"
    elsewhere = tmp_path / "c"
    elsewhere.mkdir()
    code, out, err = _audit_cli(["summary"], elsewhere, logs, monkeypatch, capsys)
    assert code == 125 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"sandgate: error: no run of this workspace ({elsewhere}) in {logs}; "), err


def test_a_learn_run_that_fetched_nothing_says_caches_may_have_served_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.audit import summary

    logs, ws = tmp_path / "logs", tmp_path / "ws"
    logs.mkdir()
    ws.mkdir()
    write_run(logs, "fetched", str(ws), "2030-01-01T00:00:00.000Z", learn=True, hosts=("x.test",))
    code, out, err = _audit_cli(["summary"], ws, logs, monkeypatch, capsys)
    assert code == 0 and "caches" not in out + err and "--learn" in err  # it fetched something: no note
    write_run(logs, "cached", str(ws), "2030-01-01T00:00:01.000Z", learn=True)
    code, out, err = _audit_cli(["summary"], ws, logs, monkeypatch, capsys)
    assert code == 0 and out.rstrip().endswith(f"sandgate: note: {summary.NOTHING_FETCHED}"), out
    code, out, err = _audit_cli(["summary", "--json"], ws, logs, monkeypatch, capsys)
    assert out.strip() == "[]" and f"sandgate: note: {summary.NOTHING_FETCHED}" in err  # JSON stays JSON
    code, out, err = _audit_cli(["suggest"], ws, logs, monkeypatch, capsys)
    assert code == 0 and "  # note: a --learn run without a single network connection" in out, out
    write_run(logs, "plain", str(ws), "2030-01-01T00:00:02.000Z")  # not a learn run: nothing to say
    code, out, err = _audit_cli(["suggest"], ws, logs, monkeypatch, capsys)
    assert code == 0 and "caches" not in out

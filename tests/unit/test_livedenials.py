"""launcher.run.livedenials: a run's own denials on stderr while it runs, rate-limited, escaped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from launcher.run import livedenials
from launcher.run.livedenials import Follower, Limiter
from netguard import audit
from netguard.audit import Record


def deny(host: str, port: int | None, task: str = "t", kind: audit.Kind = "connect", **kw: Any) -> Record:
    return audit.decision_record(task, "id", kind, "deny", host, port, reason=kw.pop("reason", "no allow rule matches"))


def test_the_first_burst_at_once_then_one_line_per_interval_then_tokens_come_back() -> None:
    lim = Limiter(burst=2, interval=5.0)
    shown = [lim.admit((f"h{i}",), f"h{i}", f"line h{i}", now=0.0) for i in range(5)]
    assert shown == [["line h0"], ["line h1"], [], [], []]
    assert lim.tick(1.0) == ["sandgate: denied 3 more destinations: h2, h3, h4 (every one is in the exit summary)"]
    assert lim.tick(2.0) == []  # nothing held back
    assert lim.admit(("h5",), "h5", "line h5", now=2.5) == []  # no token yet (refill: one per 5 s)
    assert lim.tick(3.0) == []  # one summary line per interval at most
    assert lim.tick(6.5) == ["line h5"]  # a single held line is shown whole
    assert lim.admit(("h6",), "h6", "line h6", now=30.0) == ["line h6"]  # quiet for a while: the budget is back


def test_a_destination_is_shown_once_and_a_leak_is_never_held_back() -> None:
    lim = Limiter(burst=1, interval=5.0)
    assert lim.admit(("a",), "a", "line a", now=0.0) == ["line a"]
    assert lim.admit(("a",), "a", "line a", now=0.1) == []
    assert lim.admit(("leak",), "l", "LEAK", now=0.2, urgent=True) == ["LEAK"]
    many = Limiter(burst=0)
    for i in range(7):
        many.admit((str(i),), f"d{i}", "x", now=0.0)
    assert many.tick(0.0) == [
        "sandgate: denied 7 more destinations: d0, d1, d2, d3 and 3 more (every one is in the exit summary)"
    ]


def test_describe_names_reason_and_flag_and_skips_other_runs_and_allows() -> None:
    def advice(r: Record) -> str:
        return "allow it with --allow evil.test"

    got = livedenials.describe(deny("evil.test", 443), "t", advice)
    assert got == (("evil.test", "443"), "evil.test:443", "sandgate: denied evil.test:443 (no allow rule matches): allow it with --allow evil.test", False)  # fmt: skip
    assert livedenials.describe(deny("evil.test", 443, task="other"), "t", advice) is None
    allowed = audit.decision_record("t", "id", "connect", "allow", "ok.test", 443)
    assert livedenials.describe(allowed, "t", advice) is None
    dns = livedenials.describe(deny("evil.test", None, kind="dns"), "t", advice)
    assert dns is not None and dns[0] == ("dns", "evil.test") and "denied evil.test (" in dns[2]


def test_a_hostile_name_cannot_drive_the_terminal() -> None:
    got = livedenials.describe(deny("x\x1b]0;pwned\x07\n.test", 443), "t", lambda r: "allow it")
    assert got is not None and "\x1b" not in got[2] and "\n" not in got[2] and "\\x1b" in got[2]


def test_a_leak_is_urgent() -> None:
    req = audit.request_record("t", "c", "http", "deny", "o.test", 80, "GET", "/", status=403, reason="leak", leak="K")
    got = livedenials.describe(req, "t", lambda r: "")
    assert got is not None and got[3] and got[2].startswith("sandgate: ATTEMPTED LEAK of $K")


def test_the_follower_reads_only_what_this_run_appended_and_only_its_own(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"

    def write(r: Record) -> None:
        with log.open("a") as f:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")  # as the writer does

    write(deny("before.test", 443))  # an earlier run's line with the same task: not this run's start
    r, w = os.pipe()
    f = Follower(log, "t", fd=w)
    f.start()
    try:
        write(deny("other.test", 443, task="u"))
        write(deny("mine.test", 443))
        deadline = time.monotonic() + 5
        out = b""
        while b"\n" not in out and time.monotonic() < deadline:
            os.set_blocking(r, False)
            try:
                out += os.read(r, 4096)
            except BlockingIOError:
                time.sleep(0.05)
    finally:
        f.stop()
        os.close(w)
    text = out.decode() + os.read(r, 4096).decode()
    os.close(r)
    assert text.startswith("sandgate: denied mine.test:443 (no allow rule matches): allow it with --allow mine.test")
    assert "other.test" not in text and "before.test" not in text
    f.stop()  # idempotent


def test_a_log_that_is_a_pipe_is_never_read(tmp_path: Path) -> None:
    """Reading a FIFO named by --audit-log would take the records from whoever reads it."""
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    f = Follower(fifo, "t")
    f.start()
    assert not f.regular and not f._started
    f.stop()
    assert Follower(tmp_path / "missing", "t").regular is False

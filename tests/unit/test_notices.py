"""launcher.run.notices: one JSON line per distinct denial, in the schema docs/notices.md publishes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import pytest

from launcher.errors import RunError
from launcher.run import livedenials, notices
from launcher.run.notices import Writer
from netguard import audit
from netguard.audit import Record

DOC = Path(__file__).resolve().parents[2] / "docs" / "notices.md"


def schema() -> dict[str, Any]:
    """The JSON Schema as docs/notices.md shows it: the doc and the code cannot drift apart."""
    found = re.search(r"```json\n(\{\n  \"\$schema\".*?)\n```", DOC.read_text(), re.S)
    assert found, "docs/notices.md has no JSON Schema block"
    loaded: dict[str, Any] = json.loads(found.group(1))
    return loaded


def deny(host: str, port: int | None, kind: audit.Kind = "connect", task: str = "t", **kw: Any) -> Record:
    return audit.decision_record(task, "i", kind, "deny", host, port, reason="no allow rule matches", **kw)


def line(record: Record, advice: str = "", message: str = "sandgate: denied x") -> dict[str, Any]:
    got = notices.notice(record, advice, message)
    assert got is not None
    decoded: dict[str, Any] = json.loads(notices.encode(got))
    jsonschema.validate(decoded, schema())
    return decoded


def test_a_denied_destination_names_host_port_reason_and_the_fixing_flag() -> None:
    r = deny("blocked.test", 80)
    got = line(r, "allow it with --allow blocked.test", "sandgate: denied blocked.test:80 (...)")
    assert list(got) == list(notices.FIELDS)  # every key, always, in one order
    assert got["v"] == 1 and got["kind"] == "destination" and got["task"] == "t" and got["ts"] == r["ts"]
    assert (got["host"], got["port"], got["reason"]) == ("blocked.test", 80, "no allow rule matches")
    assert got["allow"] == "--allow blocked.test" and got["advice"] == "allow it with --allow blocked.test"
    assert got["method"] is None and got["path"] is None and got["leak"] is None


def test_a_bundled_list_is_the_flag_and_the_host_stays_in_the_advice() -> None:
    got = line(deny("pypi.org", 443), "allow it with --allow pypi (or --allow pypi.org)")
    assert got["allow"] == "--allow pypi" and "--allow pypi.org" in got["advice"]


def test_what_no_flag_should_open_has_no_allow() -> None:
    vetoed = line(deny("ok.test", 443), "resolved to 10.0.0.1: refused as a rebinding/SSRF guard; only a cidr ...")
    assert vetoed["allow"] is None and vetoed["advice"].startswith("resolved to")
    udp = line(deny("198.18.0.9", 53, kind="packet", proto="udp"), "udp traffic never leaves the sandbox")
    assert udp["kind"] == "packet" and udp["proto"] == "udp" and udp["allow"] is None
    dns = line(deny("evil.test", None, kind="dns"), "allow it with --allow evil.test")
    assert dns["kind"] == "dns" and dns["port"] is None and dns["allow"] == "--allow evil.test"


def test_a_refused_request_names_method_and_path_and_a_leak_its_variable() -> None:
    req = audit.request_record("t", "i", "http", "deny", "api.test", 443, "DELETE", "/v1/x", status=403,
                               rule="GET /v1/**", reason="no request rule allows DELETE /v1/x")  # fmt: skip
    got = line(req, "", "sandgate: refused DELETE /v1/x on api.test ...")
    assert got["kind"] == "request" and (got["method"], got["path"], got["rule"]) == ("DELETE", "/v1/x", "GET /v1/**")
    assert got["allow"] is None and got["advice"] == "no request rule allows DELETE /v1/x"
    leak = audit.request_record("t", "i", "http", "deny", "o.test", 80, "GET", "/", status=403, reason="leak", leak="K")
    assert line(leak)["kind"] == "leak" and line(leak)["leak"] == "K"


def test_allows_and_other_events_are_no_notice() -> None:
    assert notices.notice(audit.decision_record("t", "i", "connect", "allow", "ok.test", 443), "", "") is None
    ok = audit.request_record("t", "i", "http", "allow", "ok.test", 443, "GET", "/", status=200)
    assert notices.notice(ok, "", "") is None


def test_a_hostile_name_arrives_escaped_as_json() -> None:
    raw = notices.encode(notices.notice(deny("x\x1b]0;p\x07\n.test", 443), "", "m") or {})
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n") and b"\x1b" not in raw and b"\\u001b" in raw


def test_the_writer_writes_each_key_once_then_stops_after_the_limit(tmp_path: Path, monkeypatch: Any) -> None:
    env: dict[str, str] = {}
    inside, path = notices.share(tmp_path, env)
    assert (inside, env) == ("/dev/sandgate-notices", {"SANDGATE_NOTICES": "/dev/sandgate-notices"})
    assert path.read_bytes() == b"" and path.stat().st_mode & 0o777 == 0o644
    with pytest.raises(RunError, match="cannot create the notices file"):  # never a file planted there before
        notices.share(tmp_path, {})
    monkeypatch.setattr(notices, "MAX_LINES", 3)
    w = Writer(path)
    asked: list[str] = []

    def advice(r: Record) -> str:
        assert r["event"] == "decision"
        asked.append(str(r["host"]))
        return f"allow it with --allow {r['host']}"

    for host in ("a.test", "a.test", "b.test", "c.test", "d.test", "e.test"):
        w.add((host, "443"), deny(host, 443), advice, f"sandgate: denied {host}:443")
    w.close()
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert [g["host"] for g in got] == ["a.test", "b.test", "c.test", None]
    assert got[-1]["kind"] == "limit" and "3 notices written" in got[-1]["reason"]
    assert asked == ["a.test", "b.test", "c.test", "d.test"]  # nothing computed for a repeat or past the limit
    for g in got:
        jsonschema.validate(g, schema())


def test_a_write_that_fails_ends_the_notices_not_the_run(tmp_path: Path) -> None:
    w = Writer(tmp_path / "gone" / notices.FILE)
    w.add(("a",), deny("a.test", 443), lambda r: "", "m")
    w.add(("b",), deny("b.test", 443), lambda r: "", "m")
    assert w.broken and w.fd is None
    w.close()


def test_the_follower_feeds_notices_of_its_own_run_and_with_quiet_prints_nothing(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text("")
    _, path = notices.share(tmp_path, {})

    def write(r: Record) -> None:
        with log.open("a") as f:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")

    f = livedenials.follower(log, "t", quiet=True, run_dir=tmp_path)
    assert f is not None and f.fd is None and f.notices is not None
    f.start()
    try:
        write(deny("other.test", 443, task="u"))  # another run's, in a shared log
        write(deny("mine.test", 443))
        write(deny("mine.test", 443))  # a retry: the same destination, one notice
        deadline = time.monotonic() + 5
        while b"\n" not in path.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # two more polls: a second line, were there one
    finally:
        f.stop()
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(g["host"], g["allow"]) for g in got] == [("mine.test", "--allow mine.test")], got
    assert got[0]["message"].startswith("sandgate: denied mine.test:443 (no allow rule matches)")


def test_without_notices_quiet_has_no_follower_and_a_pipe_is_refused(tmp_path: Path) -> None:
    assert livedenials.follower(tmp_path / "a", "t", quiet=True, run_dir=None) is None
    loud = livedenials.follower(tmp_path / "a", "t", quiet=False, run_dir=None)
    assert loud is not None and loud.notices is None and loud.fd == 2
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    with pytest.raises(RunError, match="--notices follows the audit log"):
        livedenials.follower(fifo, "t", quiet=False, run_dir=tmp_path)


def test_the_schema_requires_every_field_the_code_writes() -> None:
    s = schema()
    assert s["required"] == list(notices.FIELDS) and set(s["properties"]) == set(notices.FIELDS)
    assert s["additionalProperties"] is False


WARM = """
import json, sys
from pathlib import Path
from launcher.run import launch, livedenials, linuxbackend, options, runstate
livedenials.follower(Path(sys.argv[1]), "t", quiet=False, run_dir=None)
env = {"SANDGATE_NOTICES": "/etc/hostname"}
opts = options.RunOptions(cmd=["true"], audit_path=Path(sys.argv[1]), user=None)
files = linuxbackend._notices(opts, runstate.RunPaths(Path(sys.argv[1]).parent, "x"), env, ())
print(json.dumps([files, env, "launcher.run.notices" in sys.modules]))
"""


def test_a_run_without_notices_imports_nothing_of_them_and_passes_no_variable(tmp_path: Path) -> None:
    """A warm start pays nothing for the feature it did not ask for; the caller's variable never gets in."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", WARM, str(tmp_path / "audit.jsonl")],
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == [[], {}, False]

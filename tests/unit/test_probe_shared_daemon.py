"""verify's issue-22 probes without a sandbox: another daemon's control socket, starvation, an endless head.

Without a sandbox there is no boundary, so each probe must see a missing one ("permitted"): a real
daemon answers a peer in its own namespaces, a fake daemon that keeps every connection lets the hog
hold them all, a fake proxy that swallows a 96 MiB head lets it through. The same probes against the
real thing refuse: the daemon refuses a peer in a user namespace of its own (a forked child here),
a fake daemon that closes what is past the share, a proxy that answers 431 at the limit. The asks to
verify outside (askfiles) are answered by a thread here, as selftest/sidecar.py does.
Everything stays on 127.0.0.1 and in temporary directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import limit_record
from selftest import askfiles, markers, sidecar
from selftest.probes import core, endlesshead, starvation
from selftest.spec import VerifySpec, dump_spec

from ..support.daemonfake import Daemon, fresh_daemon
from ..support.probespec import make_spec

# ---- helpers ------------------------------------------------------------------------------------


class Answerer:
    """verify's side of askfiles for a test: answers every ask in `results` with `reply(what, body)`."""

    def __init__(self, results: Path, reply: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
        self.results, self.reply, self.asked = results, reply, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(0.02):
            for what, mark, body in askfiles.pending(self.results):
                self.asked.append((what, mark))
                askfiles.answer(self.results, what, mark, self.reply(what, body))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def results(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "results"
    d.mkdir()
    yield d


def run(name: str, spec: VerifySpec) -> core.Record:
    return core.run_one(core.REGISTRY[name], spec, "child", watchdog=None)


# ---- askfiles -----------------------------------------------------------------------------------


def test_an_ask_is_answered_through_the_results_directory(results: Path) -> None:
    a = Answerer(results, lambda what, body: {"echo": body["x"], "what": what})
    try:
        got = askfiles.ask(str(results), "victim", "child-root", {"x": 7}, timeout=5)
    finally:
        a.close()
    assert got == {"echo": 7, "what": "victim"} and a.asked == [("victim", "child-root")]
    assert not list(results.glob("ask-*"))  # taken by the answerer


def test_an_unanswered_ask_returns_none_and_stray_files_are_ignored(results: Path) -> None:
    (results / "ask-x.json").write_text("{}")  # not the ask-<what>--<mark>.json shape
    (results / "ask-victim--m.json").write_text("not json")
    assert askfiles.ask(str(results), "rss-start", "child-user", {}, timeout=0.2) is None
    assert [(w, m) for w, m, _ in askfiles.pending(results)] == [("rss-start", "child-user")]


# ---- starvation ---------------------------------------------------------------------------------


class FakeDaemon:
    """Accepts every connection and keeps the first `keep` open (None: all), closing the rest at once."""

    def __init__(self, keep: int | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port, self.keep, self.held = self.sock.getsockname()[1], keep, []  # type: ignore[var-annotated]
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            if self.keep is None or len(self.held) < self.keep:
                self.held.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)  # no thread left behind: later tests fork
        for c in self.held:
            c.close()
        self.sock.close()


VICTIM_OK = {"status": 200, "ms": 12.5, "error": ""}


@pytest.mark.parametrize("keep,observed", [(30, "blocked"), (None, "permitted")])
def test_the_hog_is_judged_by_how_many_connections_the_daemon_keeps(
    results: Path, monkeypatch: pytest.MonkeyPatch, keep: int | None, observed: str
) -> None:
    monkeypatch.setattr(starvation, "SETTLE", 1.0)  # a daemon that keeps them all never closes enough
    fake = FakeDaemon(keep)
    a = Answerer(results, lambda what, body: VICTIM_OK)
    try:
        spec = make_spec(
            blocked_ip="127.0.0.1",
            tcp_port=fake.port,
            results_dir=str(results),
            hog_connections=40,
            connection_share=30,
        )
        rec = run("starvation", spec)
    finally:
        a.close()
        fake.close()
    assert rec["observed"] == observed, rec
    held = 30 if keep else 40
    assert f"held {held} of 40 silent connections (share 30" in rec["detail"], rec
    assert "another sandbox's allowed request: HTTP 200 in 12 ms" in rec["detail"], rec
    assert a.asked == [("victim", "child")]


def test_the_hog_without_a_share_to_exceed_or_fds_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run("starvation", make_spec())["observed"] == "unsupported"  # verify named no share
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    with pytest.raises(core.Unsupported, match="hard limit here is 1024"):
        starvation.raise_nofile(4096)


def test_the_census_counts_held_closed_and_pending() -> None:
    fake = FakeDaemon(keep=3)
    hold = starvation.open_silent(("127.0.0.1", fake.port), 5)
    try:
        assert hold.settle(2, timeout=5) == (3, 2, 0)
    finally:
        hold.close()
        fake.close()


# ---- endless head -------------------------------------------------------------------------------


class FakeProxy:
    """Reads each request head: a whole one under `limit` gets 200, one past `limit` a 431 (None: no limit,
    every byte read and dropped until the head ends)."""

    def __init__(self, limit: int | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.limit, self.paths = self.sock.getsockname()[1], limit, []  # type: ignore[var-annotated]
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True)]
        self.threads[0].start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            self.threads.append(t := threading.Thread(target=self._one, args=(conn,), daemon=True))
            t.start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a client gone, a linger timed out: nothing more to serve
            buf, total = b"", 0
            while b"\r\n\r\n" not in buf[-70000:]:
                got = conn.recv(1 << 16)
                if not got:
                    return
                total += len(got)
                buf = (buf + got)[-70000:] if total > 70000 else buf + got
                if self.limit is not None and total > self.limit:
                    conn.sendall(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n")
                    conn.shutdown(socket.SHUT_WR)
                    conn.settimeout(1)
                    left = 1 << 20  # lingering like the daemon (netguard.daemon.peek): the answer is read, not reset
                    while left > 0 and (got := conn.recv(1 << 16)):
                        left -= len(got)
                    return
            self.paths.append(buf.split(b" ", 2)[1].decode() if total <= 70000 else "(huge)")
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:  # no thread left behind: later tests fork
            t.join(5)
        self.sock.close()


def _rss(what: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"kib": 100 * 1024} if what == "rss-start" else {"kib": 100 * 1024, "peak_kib": 101 * 1024, "grew_kib": 1024}


@pytest.mark.parametrize("limit,observed", [(32 * 1024, "blocked"), (None, "permitted")])
def test_an_endless_head_is_judged_by_where_it_was_cut(
    results: Path, monkeypatch: pytest.MonkeyPatch, limit: int | None, observed: str
) -> None:
    fake = FakeProxy(limit)
    monkeypatch.setattr(endlesshead, "PORT", fake.port)
    monkeypatch.setattr(endlesshead, "STREAM_MAX", endlesshead.CUT_MAX + (1 << 20))  # past the cut, yet quick
    a = Answerer(results, _rss)
    try:
        rec = run("endless_head", make_spec(allowed_ip="127.0.0.1", results_dir=str(results), head_limit=32 * 1024))
    finally:
        a.close()
        fake.close()
    assert rec["observed"] == observed, rec
    assert markers.control_path("child", "endless_head") == fake.paths[0]  # the twin came first, and got 200
    assert "an ordinary 16384-byte head: (200, b'hello')" in rec["detail"], rec
    assert "the daemon's RSS grew by 1.0 MiB" in rec["detail"], rec
    assert a.asked == [("rss-start", "child"), ("rss-end", "child")]
    if limit:
        assert "'HTTP/1.1 431 Request Header Fields Too Large'" in rec["detail"], rec


@pytest.mark.parametrize(
    "sent,reply,observed",
    [
        (40_000, b"HTTP/1.1 431 Request Header Fields Too Large\r\n", "blocked"),
        (9 << 20, b"HTTP/1.1 431 Request Header Fields Too Large\r\n", "permitted"),  # took far more first
        (96 << 20, b"", "permitted"),
        (40_000, b"HTTP/1.1 200 OK\r\n", "permitted"),
        (40_000, b"", "unsupported"),  # a bare close is not the limit's answer
    ],
)
def test_the_endless_head_verdict(sent: int, reply: bytes, observed: str) -> None:
    assert endlesshead.verdict(sent, reply) == observed


# ---- another daemon's control socket ------------------------------------------------------------


@pytest.fixture
def other() -> Iterator[Daemon]:
    with fresh_daemon("sgo") as d:
        yield d


def _spec(d: Daemon, results: Path) -> VerifySpec:
    # The "blocked host" is an address: a bound policy would send nothing further than the daemon's own
    # veto of loopback, and nothing is ever resolved. The twin's host has no server: it just fails.
    return make_spec(
        other_daemon_socket=str(d.path), blocked_host="127.0.0.1", allowed_host="127.0.0.1", results_dir=str(results)
    )


def test_a_peer_in_the_daemons_own_namespaces_is_served_so_the_probe_sees_it(other: Daemon, results: Path) -> None:
    rec = run("other_daemon_control", _spec(other, results))
    assert rec["observed"] == "permitted", rec
    detail = rec["detail"]
    assert "status: status answered" in detail and "bind: bound a policy allowing 127.0.0.1" in detail, rec
    assert "stop: stop accepted" in detail, rec
    other.proc.wait(10)  # it really stopped


#: The probe in a process that entered a user namespace of its own first, as every sandboxed process has.
IN_OWN_USERNS = """
import json, os, sys
from selftest.probes import core
from selftest.spec import load_spec
os.unshare(os.CLONE_NEWUSER)
print(json.dumps(core.run_one(core.REGISTRY["other_daemon_control"], load_spec(sys.argv[1]), "child", watchdog=None)))
"""


def test_a_peer_in_another_user_namespace_is_refused_every_operation(other: Daemon, results: Path) -> None:
    spec = dump_spec(_spec(other, results))
    r = subprocess.run([sys.executable, "-c", IN_OWN_USERNS, spec], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr  # a kernel without user namespaces for root fails here, loudly
    rec = json.loads(r.stdout)
    assert rec["observed"] == "blocked", rec
    for op in ("status", "bind", "stop"):
        assert f"{op}: refused: pid " in rec["detail"], rec
    assert "another user namespace" in rec["detail"], rec
    with other.client() as c:  # the permitted twin: a launcher beside it is still served
        assert c.status()["ok"] is True
    assert other.log().count("refused a control connection") == 3 and "bind task=" not in other.log()


def test_no_socket_or_an_unreachable_one_proves_nothing(results: Path, tmp_path: Path) -> None:
    assert run("other_daemon_control", make_spec(results_dir=str(results)))["observed"] == "unsupported"
    gone = make_spec(other_daemon_socket=str(tmp_path / "none.sock"), results_dir=str(results))
    rec = run("other_daemon_control", gone)
    assert rec["observed"] == "unsupported" and "out of reach" in rec["detail"], rec


# ---- the sidecar: verify's side -----------------------------------------------------------------


class FakeWorld:
    """What the sidecar uses of a World: run() (the victim's `sandgate run`), and the canaries."""

    def __init__(self, stdout: str, servers: list[Any] | None = None) -> None:
        self.stdout, self.servers, self.ran = stdout, servers or [], []  # type: ignore[var-annotated]

    def run(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, self.stdout, "")


class Canary:
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def log_records(self) -> list[dict[str, Any]]:
        return [{"kind": "http", "path": p} for p in self.paths]


def _sidecar(w: FakeWorld, results: Path) -> sidecar.Sidecar:
    victim = sidecar.VictimRun(["sandgate", "run", "--"], "python3", results)
    return sidecar.Sidecar(w, results, victim, {}, "allowed.test")  # type: ignore[arg-type]


def test_the_sidecar_runs_one_victim_per_ask_and_samples_the_daemons_memory(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = FakeWorld(json.dumps(VICTIM_OK) + "\n")
    side = _sidecar(w, results)
    monkeypatch.setattr(side, "_daemon_pid", os.getpid)  # this process stands in for the daemon
    with side:
        assert askfiles.ask(str(results), "victim", "child-root", {"probe": "starvation"}, 5) == VICTIM_OK
        start = askfiles.ask(str(results), "rss-start", "child-root", {}, 5)
        ballast = bytearray(80 << 20)  # the daemon "grows" by 80 MiB while sampled
        ballast[::4096] = b"x" * len(ballast[::4096])
        time.sleep(0.3)
        end = askfiles.ask(str(results), "rss-end", "child-root", {}, 5)
        del ballast
        assert askfiles.ask(str(results), "victim", "child root", {"probe": "x"}, 5) == {"error": "bad mark"}
    assert w.ran[0][-1] == "http://allowed.test/verify/child-root/control-starvation"
    assert start is not None and end is not None and end["grew_kib"] >= 64 * 1024, (start, end)
    audit = results / "audit.jsonl"
    audit.write_text(json.dumps(limit_record("t", "tcp", "connections", 3, "per-sandbox connection limit")) + "\n")
    seen, missing = side.evidence(w, "root", audit)  # type: ignore[arg-type]
    assert seen == {
        ("endless_head", "child"): f"the daemon's RSS grew by {end['grew_kib'] // 1024} MiB while the head streamed"
    }
    assert "never reached the allowed canary" in missing["starvation", "child"]  # no canary logged its twin
    assert "no `head` limit record" in missing["endless_head", "child"] or "canary" in missing["endless_head", "child"]


def test_the_sidecar_refuses_asks_it_does_not_know_and_bounds_the_victims(results: Path) -> None:
    w = FakeWorld(json.dumps(VICTIM_OK))
    side = _sidecar(w, results)
    assert side._handle("shell", "child-root", {}) == {"error": "unknown ask 'shell'"}
    assert side._handle("victim", "child-root", {"probe": "a b"}) == {"error": "refused ask"}
    for _ in range(sidecar.MAX_VICTIMS):
        side._handle("victim", "child-root", {"probe": "starvation"})
    assert side._handle("victim", "child-user", {"probe": "starvation"}) == {"error": "refused ask"}
    assert len(w.ran) == sidecar.MAX_VICTIMS


def test_the_sidecar_needs_every_twin_the_victim_and_the_limit_records(results: Path) -> None:
    mark = markers.mark("child", "user")
    twins = [markers.control_path(mark, p) for p in ("other_daemon_control", "starvation", "endless_head")]
    w = FakeWorld("", [Canary(twins)])
    side = _sidecar(w, results)
    side.victims[mark] = VICTIM_OK
    side.rss[mark] = {"kib": 1000, "peak_kib": 1500, "grew_kib": 500}
    audit = results / "audit.jsonl"
    audit.write_text("".join(json.dumps(limit_record("t", "tcp", k, 1, "why")) + "\n" for k in ("connections", "head")))
    assert side.evidence(w, "user", audit) == ({}, {})  # type: ignore[arg-type]
    side.victims[mark] = {"status": 0, "error": "exit 56"}
    assert "was not answered" in side.evidence(w, "user", audit)[1]["starvation", "child"]  # type: ignore[arg-type]

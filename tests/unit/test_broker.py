"""launcher/approvals: the broker between the daemon and one answerer, without a sandbox.

The daemon is played by a socket client speaking netguard.approval; the terminal by a socketpair
handed to the prompt as its tty; an embedding tool by a client of the --approvals socket.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.approvals.broker import Broker
from launcher.approvals.prompt import shown
from netguard.approval import Decision, Request, decode, encode
from netguard.audit import AuditLog, read_records

ASK_POLICY = "version: 1\nnetwork:\n  ask: [ask.test]\n"


@dataclass
class Daemon:
    """The daemon's side of the internal socket: send requests, read decisions."""

    sock: socket.socket

    def send(self, line: bytes) -> None:
        self.sock.sendall(line)

    def ask(self, req: Request) -> None:
        self.send(encode(req))

    def decision(self, timeout: float = 10) -> Decision:
        msg = decode(read_line(self.sock, timeout))
        assert isinstance(msg, Decision)
        return msg


@dataclass
class Tty:
    """The human's end of a fake terminal: what the prompt wrote, and keys to type."""

    sock: socket.socket
    peer: socket.socket  # the prompt's end: each question opens a fresh descriptor of it, as of /dev/tty
    opened: int = 0
    seen: bytearray = field(default_factory=bytearray)

    def open(self) -> int:
        self.opened += 1
        return os.dup(self.peer.fileno())

    def wait_for(self, text: bytes, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        while text not in self.seen:
            assert time.monotonic() < deadline, bytes(self.seen)
            try:
                self.seen += self.sock.recv(4096)
            except TimeoutError:
                continue

    def type(self, keys: bytes) -> None:
        self.sock.sendall(keys)


@dataclass
class Setup:
    tmp: Path
    make: Callable[..., Broker]
    audit_path: Path

    def approvals(self) -> list[tuple[object, ...]]:
        recs: list[Any] = read_records(self.audit_path)
        return [(r["stage"], r["host"], r["asked_by"], r["answer"], r["by"]) for r in recs]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    brokers: list[Broker] = []
    logs: list[AuditLog] = []

    def make(timeout: float = 10, **kw: object) -> Broker:
        log = AuditLog(tmp_path / "audit.jsonl")
        logs.append(log)
        b = Broker(tmp_path / "internal.sock", log, "task1", timeout, **kw)  # type: ignore[arg-type]
        brokers.append(b)
        b.start()
        return b

    yield Setup(tmp_path, make, tmp_path / "audit.jsonl")
    for b in brokers:
        b.stop()
    for log in logs:
        log.close()


def read_line(s: socket.socket, timeout: float = 10) -> bytes:
    """One line, and not a byte of the next (a byte at a time: the test has no buffer to keep)."""
    s.settimeout(timeout)
    line = b""
    while not line.endswith(b"\n"):
        byte = s.recv(1)
        assert byte, "the other side closed the connection"
        line += byte
    return line


def connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(path))
    return s


@pytest.fixture
def daemon(tmp_path: Path) -> Callable[[], Daemon]:
    return lambda: Daemon(connect(tmp_path / "internal.sock"))


@pytest.fixture
def tty() -> Iterator[Tty]:
    mine, theirs = socket.socketpair()
    t = Tty(mine, theirs)
    yield t
    mine.close()
    theirs.close()


def request(qid: str = "q1", host: str = "ask.test", port: int = 443) -> Request:
    return Request(qid, host, port, "tls", "ask rule", ("10.0.0.2", 5000))


# ---- the terminal ------------------------------------------------------------------------------


def test_the_terminal_prompt_answers_and_always_is_written_through_amend(
    setup: Setup, daemon: Callable[[], Daemon], tty: Tty
) -> None:
    policy = setup.tmp / "policy.yaml"
    policy.write_text(ASK_POLICY)
    asked: list[tuple[str, int]] = []

    def who(ip: str, port: int) -> str:
        asked.append((ip, port))
        return "curl[42]"

    b = setup.make(policy_file=policy, who=who, tty=tty.open)
    d = daemon()
    d.ask(request())
    tty.wait_for(f"sandgate [{b.code}] allow ask.test:443 (tls) asked by curl[42]? ".encode())
    tty.type(b"x\n")  # not a choice: asked again
    tty.wait_for(b"o, r, a or d: ")
    tty.type(b"Always\n")
    assert d.decision() == Decision("q1", "always")
    tty.wait_for(f"sandgate [{b.code}] always".encode())
    assert asked == [("10.0.0.2", 5000)]
    assert "ask.test" in policy.read_text().split("allow:")[1]  # amend's verified edit, not a rewrite
    assert policy.read_text().startswith(ASK_POLICY.split("network:")[0])
    assert setup.approvals() == [
        ("question", "ask.test", "curl[42]", None, None),
        ("answer", "ask.test", "curl[42]", "always", "terminal"),
    ]


def test_no_answer_on_the_terminal_is_a_timeout(setup: Setup, daemon: Callable[[], Daemon], tty: Tty) -> None:
    b = setup.make(timeout=0.3, tty=tty.open)
    d = daemon()
    t0 = time.monotonic()
    d.ask(request())
    assert d.decision() == Decision("q1", "timeout") and time.monotonic() - t0 < 5
    tty.wait_for(f"sandgate [{b.code}] no answer: denied".encode())
    assert setup.approvals()[-1][3:] == ("timeout", "timeout")


def test_no_terminal_is_a_denial_at_once(setup: Setup, daemon: Callable[[], Daemon]) -> None:
    def no_tty() -> int:
        raise OSError("no controlling terminal")

    setup.make(tty=no_tty)
    d = daemon()
    d.ask(request())
    assert d.decision(timeout=5) == Decision("q1", "deny")
    assert setup.approvals()[-1][3:] == ("deny", "no-terminal")


def test_the_prompt_shows_no_control_characters_from_the_sandbox(
    setup: Setup, daemon: Callable[[], Daemon], tty: Tty
) -> None:
    # A process names itself (prctl PR_SET_NAME): an escape sequence there could redraw the prompt.
    setup.make(who=lambda ip, port: "x\x1b[2K\rsandgate", tty=tty.open)
    d = daemon()
    d.ask(request())
    tty.wait_for(b"asked by x?[2K?sandgate? ")
    tty.type(b"d\n")
    assert d.decision() == Decision("q1", "deny")
    assert shown("a\tb\x00c\u200bd") == "a?b?c?d"


# ---- an embedding tool over --approvals ------------------------------------------------------------


def read_request(s: socket.socket) -> Request:
    msg = decode(read_line(s))
    assert isinstance(msg, Request)
    return msg


def test_an_external_client_answers(setup: Setup, daemon: Callable[[], Daemon], tty: Tty) -> None:
    chan = setup.tmp / "approvals.sock"
    b = setup.make(timeout=7, channel=str(chan), who=lambda ip, port: "pip[7]", tty=tty.open)
    assert str(chan) in b.banner() and b.code in b.banner()
    assert chan.stat().st_mode & 0o777 == 0o600  # only its owner may answer
    d = daemon()
    d.ask(request())  # asked before any tool connected: a late tool still gets it
    time.sleep(0.2)
    tool = connect(chan)
    got = read_request(tool)
    assert got == Request("q1", "ask.test", 443, "tls", "ask rule", ("10.0.0.2", 5000), "pip[7]", 7.0)
    tool.sendall(b'{"type": "decision", "id": "q1", "decision": "run"}\n')  # README's spelling
    assert d.decision() == Decision("q1", "run")
    assert tty.opened == 0  # with a channel, the terminal is never asked
    assert setup.approvals()[-1][3:] == ("run", "socket")
    tool.close()


def test_a_silent_client_is_a_timeout_and_stop_removes_the_channel(setup: Setup, daemon: Callable[[], Daemon]) -> None:
    chan = setup.tmp / "approvals.sock"
    b = setup.make(timeout=0.5, channel=str(chan))
    tool = connect(chan)
    d = daemon()
    d.ask(request())
    assert read_request(tool).id == "q1"
    assert d.decision() == Decision("q1", "timeout")
    assert setup.approvals()[-1][3:] == ("timeout", "timeout")
    b.stop()
    assert not chan.exists()
    tool.close()


def test_always_without_a_policy_file_prints_the_line_to_add(
    setup: Setup, daemon: Callable[[], Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    chan = setup.tmp / "approvals.sock"
    setup.make(channel=str(chan))
    tool = connect(chan)
    d = daemon()
    d.ask(request(port=8443))
    read_request(tool)
    tool.sendall(encode(Decision("q1", "always")))
    assert d.decision() == Decision("q1", "always")
    assert "to always allow ask.test:8443, add  - " in capsys.readouterr().err
    tool.close()


# ---- malformed messages ------------------------------------------------------------------------------


def test_malformed_client_messages_are_refused(setup: Setup, daemon: Callable[[], Daemon]) -> None:
    chan = setup.tmp / "approvals.sock"
    setup.make(channel=str(chan))
    tool = connect(chan)
    d = daemon()
    d.ask(request())
    read_request(tool)
    for line in (
        b"garbage\n",
        b'{"type": "decision", "id": "q1", "decision": "yes"}\n',
        b'{"type": "decision", "id": "q1", "decision": "timeout"}\n',  # only the broker says timeout
        b'{"type": "decision", "id": "other", "decision": "once"}\n',  # no such question
        b'{"id": "q1", "answer": "once"}\n',  # the old daemon-hop spelling
        encode(request("q1")),  # a tool cannot ask
    ):
        tool.sendall(line)
    time.sleep(0.3)
    tool.sendall(encode(Decision("q1", "deny")))  # still open: the first VALID decision wins
    tool.sendall(encode(Decision("q1", "once")))
    assert d.decision() == Decision("q1", "deny")
    tool.close()


def test_malformed_daemon_messages_are_refused(setup: Setup, daemon: Callable[[], Daemon], tty: Tty) -> None:
    setup.make(tty=tty.open)
    d = daemon()
    d.send(b"garbage\n")  # names no question: nothing to answer
    d.send(
        json.dumps({"type": "request", "id": "bad", "host": "h.test", "port": 99999, "kind": "tls"}).encode() + b"\n"
    )
    assert d.decision(timeout=5) == Decision("bad", "deny")  # named but unreadable: denied at once
    assert tty.opened == 0 and setup.approvals() == []  # and no human was bothered
    d.ask(request("q2"))  # the connection still serves
    tty.wait_for(b"allow ask.test:443")
    tty.type(b"o\n")
    assert d.decision() == Decision("q2", "once")


def test_concurrent_questions_each_get_their_answer(setup: Setup, daemon: Callable[[], Daemon]) -> None:
    chan = setup.tmp / "approvals.sock"
    setup.make(channel=str(chan))
    tool = connect(chan)
    d = daemon()
    for i in range(3):
        d.ask(request(f"q{i}", host=f"h{i}.test"))
    got = {read_request(tool).id for _ in range(3)}
    assert got == {"q0", "q1", "q2"}
    for qid, answer in (("q2", "deny"), ("q0", "once"), ("q1", "run")):
        tool.sendall(encode(Decision(qid, answer)))  # type: ignore[arg-type]
    assert {d.decision() for _ in range(3)} == {Decision("q0", "once"), Decision("q1", "run"), Decision("q2", "deny")}
    tool.close()

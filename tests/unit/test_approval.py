"""netguard/approval.py: the one approval protocol. What encode writes decode reads back; anything else is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.approval import MAX_LINE, Decision, ProtocolError, Request, choice, decode, encode

texts = st.text(min_size=1, max_size=40)
requests = st.builds(
    Request,
    id=st.text(min_size=1, max_size=64),
    host=texts,
    port=st.integers(0, 0xFFFF),
    kind=texts,
    reason=st.text(max_size=40),
    peer=st.none() | st.tuples(texts, st.integers()),
    asked_by=st.none() | texts,
    timeout=st.none() | st.floats(allow_nan=False, allow_infinity=False),
)
decisions = st.builds(Decision, id=st.text(min_size=1, max_size=64), decision=st.sampled_from(["once", "timeout"]))


@given(requests | decisions)
def test_what_encode_writes_decode_reads_back(msg: Request | Decision) -> None:
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one message, one line
    assert decode(line) == msg


def test_the_documented_wire_spelling() -> None:
    req = Request("q1", "ask.test", 443, "tls", "r", ("10.0.0.2", 5000), "curl[12]", 60.0)
    assert json.loads(encode(req)) == {
        "type": "request",
        "id": "q1",
        "host": "ask.test",
        "port": 443,
        "kind": "tls",
        "reason": "r",
        "peer": ["10.0.0.2", 5000],
        "asked_by": "curl[12]",
        "timeout": 60.0,
    }
    assert json.loads(encode(Decision("q1", "always"))) == {"type": "decision", "id": "q1", "decision": "always"}
    # What README's example tool sends, and a request with only the required fields.
    assert decode(b'{"type": "decision", "id": "q1", "decision": "once"}') == Decision("q1", "once")
    minimal = b'{"type": "request", "id": "q", "host": "h.test", "port": 80, "kind": "http", "extra": 1}'
    assert decode(minimal) == Request("q", "h.test", 80, "http")


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"decision"',
        b'{"type": "decision", "decision": "once"}',
        b'{"type": "decision", "id": 7, "decision": "once"}',
        b'{"type": "decision", "id": "", "decision": "once"}',
        b'{"type": "decision", "id": "' + b"x" * 65 + b'", "decision": "once"}',
        b'{"id": "q", "answer": "once"}',  # the old daemon-hop spelling: one protocol now
        b'{"type": "answer", "id": "q", "decision": "once"}',
        b"{" + b" " * MAX_LINE + b"}",
    ],
)
def test_refused_without_a_question_to_name(line: bytes) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(line)
    assert e.value.id is None or e.value.id == "q"


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "decision", "decision": "yes"},
        {"type": "decision", "decision": None},
        {"type": "request", "host": "h", "port": True, "kind": "tls"},  # JSON true is no port
        {"type": "request", "host": "h", "port": "443", "kind": "tls"},
        {"type": "request", "host": "h", "port": 65536, "kind": "tls"},
        {"type": "request", "host": "h", "port": -1, "kind": "tls"},
        {"type": "request", "host": "", "port": 443, "kind": "tls"},
        {"type": "request", "host": "h", "port": 443},
        {"type": "request", "host": "h", "port": 443, "kind": "tls", "peer": ["10.0.0.2"]},
        {"type": "request", "host": "h", "port": 443, "kind": "tls", "peer": [1, 2]},
        {"type": "request", "host": "h", "port": 443, "kind": "tls", "asked_by": 3},
        {"type": "request", "host": "h", "port": 443, "kind": "tls", "timeout": "60"},
        {"type": "request", "host": "h", "port": 443, "kind": "tls", "timeout": False},
    ],
)
def test_refused_naming_the_question(fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(json.dumps({"id": "q7", **fields}).encode())
    assert e.value.id == "q7"  # so a reader can deny that question at once


def test_only_the_broker_says_timeout() -> None:
    assert choice("timeout") is None
    assert [choice(a) for a in ("once", "run", "always", "deny")] == ["once", "run", "always", "deny"]

"""The daemon <-> relay worker messages (netguard.relay.relaywire) and the fd arithmetic around them: pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.daemon.fdlimit import PER_CONNECTION, RESERVE, Budget
from netguard.relay import relaywire as w
from netguard.relay.relayworker import capacity

ids = st.integers(min_value=0, max_value=2**64 - 1)
counts = st.integers(min_value=0, max_value=2**64 - 1)
whys = st.text(max_size=200)
messages = st.one_of(
    st.builds(w.Hello, counts),
    st.builds(w.Add, ids, st.floats(min_value=0, max_value=1e9)),
    st.builds(w.Cut, st.lists(ids, max_size=50).map(tuple), whys),
    st.builds(w.Done, st.lists(st.builds(w.Ended, ids, counts, counts, st.none() | whys), max_size=20).map(tuple)),
)


@given(messages)
def test_every_message_comes_back_as_it_was_sent(m: w.Message) -> None:
    assert w.decode(w.encode(m)) == m


@given(st.binary(max_size=64))
def test_garbage_is_a_wire_error_or_a_message_never_a_crash(data: bytes) -> None:
    try:
        m = w.decode(data)
    except w.WireError:
        return
    assert w.decode(w.encode(m)) == m  # what was accepted means exactly one message


def test_a_truncated_message_is_refused() -> None:
    for m in (w.Hello(5), w.Add(1, 2.0), w.Cut((1, 2, 3), "drop"), w.Done((w.Ended(1, 2, 3, "why"),))):
        data = w.encode(m)
        with pytest.raises(w.WireError):
            w.decode(data[:-1])
    with pytest.raises(w.WireError):
        w.decode(w.encode(w.Hello(5)) + b"x")


def test_big_cuts_and_reports_are_split_below_a_datagram_and_lose_nothing() -> None:
    long_why = "x" * 5000  # cut to the wire's limit, so a batch's size is known in advance
    cut = w.Cut(tuple(range(20000)), long_why)
    parts = [w.decode(d) for d in w.batches(cut)]
    assert all(len(d) <= w.MAX_DATAGRAM for d in w.batches(cut))
    assert sum((p.flows for p in parts if isinstance(p, w.Cut)), ()) == cut.flows
    done = w.Done(tuple(w.Ended(i, i, 2 * i, "é" * 300 if i % 2 else None) for i in range(3000)))
    datagrams = w.batches(done)
    assert len(datagrams) > 1 and all(len(d) <= w.MAX_DATAGRAM for d in datagrams)
    back = sum((p.ended for p in map(w.decode, datagrams) if isinstance(p, w.Done)), ())
    assert [(e.flow, e.up, e.down, e.why is None) for e in back] == [(i, i, 2 * i, i % 2 == 0) for i in range(3000)]


def test_the_budget_counts_only_what_this_process_holds() -> None:
    away = [0]
    b = Budget(RESERVE + 20 * PER_CONNECTION, lambda: away[0])
    assert PER_CONNECTION == 2 and b.limit == 20  # two sockets a connection: no dups kept beside mitmproxy's
    assert all(b.take() for _ in range(20)) and not b.take()
    away[0] = 4  # four of them now splice in a worker: their fds are not ours
    assert [b.take() for _ in range(5)] == [True] * 4 + [False]
    assert (b.live, b.held, b.refused) == (24, 20, 2)


def test_a_worker_holds_two_fds_a_flow_past_its_reserve() -> None:
    assert capacity(20000) == (20000 - (2 * 128 + 64)) // 2 == 9840  # two workers hold 10,000 on this box
    assert capacity(100) == 0

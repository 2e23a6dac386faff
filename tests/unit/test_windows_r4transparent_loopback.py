"""r4-transparent T1: during `sandgate run --transparent` the sandbox user reaches no loopback port but the proxy's.

The transparent permits are hard and outweigh sandgate's catch-all block, the one filter that keeps the sandbox
user off loopback (and loopback is never diverted to the redirect loop); the firewall's loopback block cannot undo
a hard permit. Decided through tests/support/wfpeval.py (WFP's documented arbitration over the wired filters).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from netguard.windows import firewall, wfp, wfpwire, win32wfp
from tests.support import wfpeval

SANDBOX = "S-1-5-21-1111111111-2222222222-3333333333-1001"
REAL = "S-1-5-21-1111111111-2222222222-3333333333-1000"
TCP, UDP = wfp.IPPROTO_TCP, 17
PORT = 3128


def _decide(conn: wfpeval.Connect, *, transparent: bool) -> str:
    plan = wfp.plan_filters(SANDBOX, (PORT,), owner=REAL)
    wired = [wfpwire.wire(f, REAL) for f in plan.filters]
    if transparent:
        wired += [wfpwire.wire(f) for f in wfp.transparent_permits(SANDBOX)]
    return wfpeval.decide(wired, firewall.plan_rules(SANDBOX, (PORT,)), conn)


@pytest.mark.parametrize(
    ("addr", "port"),
    [("127.0.0.1", 5432), ("127.0.0.1", 8085), ("127.5.5.5", 3128), ("::1", 22), ("127.0.0.1", 3129)],
)
def test_no_loopback_port_but_the_proxys_in_a_transparent_run(addr: str, port: int) -> None:
    """A local database, the redirect loop's own resolver (8085), another loopback address, ::1: refused."""
    conn = wfpeval.Connect(SANDBOX, TCP, addr, port)
    assert _decide(conn, transparent=False) == "block"
    assert _decide(conn, transparent=True) == "block"  # permitted, unaudited, before the fix


@pytest.mark.parametrize("addr", ["127.0.0.1", "::1"])
def test_the_proxy_port_stays_reachable(addr: str) -> None:
    for transparent in (False, True):
        assert _decide(wfpeval.Connect(SANDBOX, TCP, addr, PORT), transparent=transparent) == "permit"


def test_off_host_tcp_is_permitted_only_while_the_loop_holds_its_permits() -> None:
    for addr in ("198.18.0.7", "2001:db8::7"):
        conn = wfpeval.Connect(SANDBOX, TCP, addr, 443)
        assert _decide(conn, transparent=False) == "block"
        assert _decide(conn, transparent=True) == "permit"  # hard: the firewall's off-host block cannot undo it


def test_dns_udp_and_other_users_are_as_without_the_loop() -> None:
    for conn in (
        wfpeval.Connect(SANDBOX, TCP, "198.18.0.7", 53),
        wfpeval.Connect(SANDBOX, UDP, "198.18.0.7", 443),
        wfpeval.Connect(SANDBOX, TCP, "127.0.0.1", 53),
    ):
        assert _decide(conn, transparent=True) == "block"
    assert _decide(wfpeval.Connect(REAL, TCP, "127.0.0.1", 5432), transparent=True) == "permit"


def test_the_loopback_exclusion_goes_on_the_wire_as_flags_none_set() -> None:
    """FWPM_CONDITION_FLAGS, FWP_UINT32, FWP_MATCH_FLAGS_NONE_SET (8), FWP_CONDITION_FLAG_IS_LOOPBACK (1)."""
    for f in wfp.transparent_permits(SANDBOX):
        flags = [c for c in wfpwire.wire(f).conditions if c.field_key == "632ce23b-5167-435c-86d7-e903684aa80c"]
        assert flags == [wfpwire.WireCondition(flags[0].field_key, wfpwire.FWP_UINT32, 1, 8)]
    with pytest.raises(wfp.WfpPlanError):  # bits are matched only on a flags field
        wfpwire.condition(wfp.Condition("remote_port", 1, "none_set"))


def test_win32wfp_lays_the_match_type_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """FWPM_FILTER_CONDITION0.matchType carries the plan's match type, not always FWP_MATCH_EQUAL."""
    (permit, _) = wfp.transparent_permits(SANDBOX)
    added: list[tuple[int, int, int]] = []

    def fake(name: str) -> Any:
        def add(engine: int, flt: Any, sd: Any, fid: Any) -> int:
            f = flt._obj  # ctypes.byref(FWPM_FILTER0)
            for i in range(f.numFilterConditions):
                c = f.filterCondition[i]
                added.append((c.matchType, c.conditionValue.type, c.conditionValue.u.uint32))
            return 0

        return {"FwpmFilterAdd0": add}.get(name, lambda *a: 0)

    monkeypatch.setattr(win32wfp, "fn", fake)
    monkeypatch.setattr(win32wfp, "_sd", lambda sddl, keep: keep.append(ctypes.c_uint32(0)) or ctypes.c_void_p(0))
    win32wfp.add_filter(1, wfpwire.wire(permit), wfp.derived_key("p"), wfp.derived_key("s"))
    assert (wfpwire.FWP_MATCH_FLAGS_NONE_SET, wfpwire.FWP_UINT32, wfp.FLAG_IS_LOOPBACK) in added

"""WFP filter plans and firewall rule lists for the sandbox user (pure; installed only on Windows)."""

from __future__ import annotations

import uuid

import pytest

from netguard.windows import firewall, wfp

SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _by_name(plan: wfp.WfpPlan) -> dict[str, wfp.WfpFilter]:
    return {f.name: f for f in plan.filters}


def test_keys_are_stable_distinct_and_per_user() -> None:
    a, b = wfp.plan_filters(SID, (3128,)), wfp.plan_filters(SID, (3128,))
    assert a == b  # same keys on every run and machine: idempotent setup, exact removal
    keys = [f.key for f in a.filters]
    assert len(set(keys)) == len(keys)
    other = wfp.plan_filters("S-1-5-21-1-2-3-1002", (3128,))
    assert not set(keys) & {f.key for f in other.filters}
    assert a.provider_key != a.sublayer_key
    assert a.sublayer_weight == 0xFFFF  # evaluated first: no other product's hard permit comes before
    assert wfp.derived_key("x") == uuid.uuid5(wfp.NAMESPACE, "x")


def test_every_filter_names_the_user_and_the_only_permit_is_loopback_tcp_to_the_proxy() -> None:
    plan = wfp.plan_filters(SID, (3128, 3129))
    for f in plan.filters:
        assert f.conditions[0] == wfp.Condition("user", f"O:LSD:(A;;CC;;;{SID})")
        assert f.persistent
    permits = [f for f in plan.filters if f.action == "permit"]
    assert {(f.layer, c.value) for f in permits for c in f.conditions if c.field == "remote_addr"} == {
        ("ALE_AUTH_CONNECT_V4", "127.0.0.1"),
        ("ALE_AUTH_CONNECT_V6", "::1"),
    }
    assert sorted(c.value for f in permits for c in f.conditions if c.field == "remote_port") == [
        3128,
        3128,
        3129,
        3129,
    ]
    assert all(wfp.Condition("protocol", wfp.IPPROTO_TCP) in f.conditions for f in permits)


def test_catch_all_and_dns_blocks_are_hard_and_outweigh_as_intended() -> None:
    f = _by_name(wfp.plan_filters(SID, (3128,)))
    for fam in ("V4", "V6"):
        block = f[f"sandgate block all {fam}"]
        assert block.action == "block" and block.hard and block.conditions == (block.conditions[0],)
        for port in (53, 853):  # DNS to ANY address, loopback included, above every permit
            dns = f[f"sandgate block dns {port} {fam}"]
            assert dns.hard and dns.weight > f[f"sandgate permit proxy 3128 {fam}"].weight > block.weight
        assert f[f"sandgate block icmp {fam}"].layer.startswith("ALE_RESOURCE_ASSIGNMENT")
    assert f["sandgate block all V4"].layer_key == uuid.UUID("c38d57d1-05a7-4c33-904f-7fbceee60e82")
    assert f["sandgate block all V6"].layer_key == uuid.UUID("4a72393b-319f-44bc-84c3-ba54dcb3b6b4")


@pytest.mark.parametrize("ports", [(), (53,), (3128, 853), (0,), (70000,)])
def test_plans_that_would_weaken_the_boundary_are_refused(ports: tuple[int, ...]) -> None:
    with pytest.raises(wfp.WfpPlanError):
        wfp.plan_filters(SID, ports)


@pytest.mark.parametrize("sid", ["S-1-1-0", "S-1-5-32-545", "Everyone", "S-1-5-21-1-x-3", ""])
def test_only_one_local_account_can_be_named(sid: str) -> None:
    with pytest.raises(wfp.WfpPlanError):  # Everyone / Users would cut the whole machine off
        wfp.plan_filters(sid, (3128,))


def test_transparent_permits_are_dynamic_tcp_only_and_below_dns() -> None:
    permits = wfp.transparent_permits(SID)
    assert {f.layer for f in permits} == {"ALE_AUTH_CONNECT_V4", "ALE_AUTH_CONNECT_V6"}
    for f in permits:
        assert not f.persistent  # dies with the redirect loop's session: fail closed
        assert f.hard  # must outweigh the firewall's off-host block in its lower sublayer
        assert wfp.Condition("protocol", wfp.IPPROTO_TCP) in f.conditions
        assert wfp.W_BLOCK < f.weight < wfp.W_DNS
    assert not {f.key for f in permits} & {f.key for f in wfp.plan_filters(SID, (3128,)).filters}


def test_port_complement() -> None:
    assert firewall.port_complement((3128,)) == ("1-3127", "3129-65535")
    assert firewall.port_complement((3128, 3129)) == ("1-3127", "3130-65535")
    assert firewall.port_complement((1, 65535)) == ("2-65534",)
    assert firewall.port_complement((2, 65534)) == ("1", "3-65533", "65535")


def test_firewall_rules_in_order_all_block_and_scoped_to_the_sid() -> None:
    rules = firewall.plan_rules(SID, (3128,))
    assert rules[0].name == f"sandgate-{SID}-out-offhost"
    assert [r.direction for r in rules] == ["out", "out", "out", "in"]
    assert all(r.action == "block" and r.local_user_sddl == f"O:LSD:(A;;CC;;;{SID})" for r in rules)
    offhost, loop_tcp, loop_udp, inbound = rules
    assert inbound.remote_addresses == ("*",)
    assert "127.0.0.1" not in str(offhost.remote_addresses) and offhost.protocol == "any"
    assert loop_tcp.protocol == "tcp" and loop_tcp.remote_ports == ("1-3127", "3129-65535")
    assert loop_udp.protocol == "udp" and loop_udp.remote_ports == ("*",)
    assert len({r.name for r in rules}) == len(rules)


REAL = "S-1-5-21-1111111111-2222222222-3333333333-1000"


def test_nothing_listens_or_is_accepted_as_the_sandbox_user() -> None:
    """H5: hard blocks at ALE_AUTH_LISTEN and ALE_AUTH_RECV_ACCEPT, v4 and v6, for the sandbox SID only."""
    f = _by_name(wfp.plan_filters(SID, (3128,)))
    for layer in ("LISTEN_V4", "LISTEN_V6", "RECV_ACCEPT_V4", "RECV_ACCEPT_V6"):
        block = f[f"sandgate block inbound {layer}"]
        assert block.layer == f"ALE_AUTH_{layer}" and block.action == "block" and block.hard
        assert block.conditions == (wfp.Condition("user", f"O:LSD:(A;;CC;;;{SID})"),)
    keys = {  # fwpmu.h
        "ALE_AUTH_LISTEN_V4": "88bb5dad-76d7-4227-9c71-df0a3ed7be7e",
        "ALE_AUTH_LISTEN_V6": "7ac9de24-17dd-4814-b4bd-a9fbc95a321b",
        "ALE_AUTH_RECV_ACCEPT_V4": "e1cd9fe7-f4b5-4273-96c0-592e487b8650",
        "ALE_AUTH_RECV_ACCEPT_V6": "a3b42c97-9f04-4672-b87e-cee9c483257f",
    }
    assert {k: str(v) for k, v in wfp.LAYERS.items() if k in keys} == keys
    assert str(wfp.FIELDS["local_port"]) == "0c1ba1af-5765-453f-af22-a8f791ac775b"


def test_only_the_real_users_listener_accepts_on_the_proxy_port() -> None:
    """H6: another user's listener on 127.0.0.1:3128 must not accept the sandbox's connections
    (no policy = no proxy = the port is free for anyone): a hard block at RECV_ACCEPT whose user
    condition is true for every listener but the real user's."""
    plan = wfp.plan_filters(SID, (3128,), owner=REAL)
    guards = [f for f in plan.filters if f.name.startswith("sandgate guard proxy")]
    assert {f.layer for f in guards} == {"ALE_AUTH_RECV_ACCEPT_V4", "ALE_AUTH_RECV_ACCEPT_V6"}
    for g in guards:
        assert g.action == "block" and g.hard and g.persistent and g.weight == wfp.W_DNS
        user, addr, port = g.conditions
        assert user.value == f"O:LSD:(D;;CC;;;{REAL})(A;;CC;;;WD)"  # deny before allow: all but REAL
        assert addr.value in ("127.0.0.1", "::1") and port == wfp.Condition("local_port", 3128)
    assert plan.reader_sid == REAL
    assert wfp.filter_sddl(REAL) == f"O:BAD:(A;;GA;;;BA)(A;;GA;;;SY)(A;;0x20080;;;{REAL})"
    with pytest.raises(wfp.WfpPlanError):
        wfp.plan_filters(SID, (3128,), owner="S-1-1-0")  # Everyone as the owner would guard nothing
    # the guard's keys are the sandbox user's too: setup --remove finds them by derivation
    assert len({f.key for f in plan.filters}) == len(plan.filters)


ENTRA = "S-1-12-1-1111111111-2222222222-3333333333-4444444444"  # an AzureAD\ user: not S-1-5-21


def test_an_entra_id_real_user_gets_the_read_grant_and_the_port_guard() -> None:
    """Session 38: the real user of a cloud-joined machine has an S-1-12-1 SID; refused as "not a
    local account", setup and every run's check raised (a traceback) before anything was decided."""
    plan = wfp.plan_filters(SID, (3128,), owner=ENTRA)
    assert plan.reader_sid == ENTRA and wfp.filter_sddl(ENTRA).endswith(f"(A;;0x20080;;;{ENTRA})")
    guard = next(f for f in plan.filters if f.name.startswith("sandgate guard proxy"))
    assert guard.conditions[0].value == f"O:LSD:(D;;CC;;;{ENTRA})(A;;CC;;;WD)"
    with pytest.raises(wfp.WfpPlanError):  # the sandbox user is still only ever a local account
        wfp.plan_filters(ENTRA, (3128,))


@pytest.mark.parametrize("owner", ["S-1-12-1-1-x", "S-1-12-2-1-2", "S-1-5-21-1)(A;;GA;;;WD", "S-1-12-1-"])
def test_nothing_else_is_spliced_into_the_grant(owner: str) -> None:
    with pytest.raises(wfp.WfpPlanError):
        wfp.plan_filters(SID, (3128,), owner=owner)

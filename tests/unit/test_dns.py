"""netguard.decision.dns: what a sandbox's DNS query may carry out, and what may come back in.

A fake upstream resolver (tests.dnsfake) records what it is asked: each test shows what the client got and what left.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import dns.update
import pytest

from netguard import rules
from netguard.asking import Approver
from netguard.audit import AuditLog, read_records
from netguard.decision import dns as dnsgate
from netguard.decision.binding import Binding
from netguard.policy import parse_network

from ..support.dnsfake import FakeDns, tcp_ask, udp_ask


@pytest.fixture
def upstream() -> Iterator[FakeDns]:
    srv = FakeDns()
    try:
        yield srv
    finally:
        srv.close()


def make_binding(
    tmp_path: Path, upstream: FakeDns, *, learn: bool = False, ask_all: bool = False, approver: Approver | None = None
) -> Binding:
    pol = parse_network(
        {
            "allow": [
                "allowed.test",
                "*.wild.test",
                "chain.test",
                "nx.test",
                "tc.test",
                "big.test",
                {"cidr": "127.0.0.0/8", "ports": [80]},
                {"host": "*.txt.test", "dns": ["TXT", "mx"]},
            ],
            "deny": ["evil.wild.test"],
            "ask": ["ask.test"],
            "resolver": f"127.0.0.1:{upstream.port}",
        },
        "test.yaml",
    )
    log = AuditLog(tmp_path / "audit.jsonl")
    return Binding("t1", rules.compile_policy(pol), log, learn=learn, ask_all=ask_all, approver=approver)


def ask(b: Binding, wire: bytes, *, tcp: bool = False) -> dns.message.Message | None:
    out = asyncio.run(dnsgate.DnsGate(timeout=2).answer(b, wire, ("10.0.0.2", 5353), tcp=tcp))
    return None if out is None else dns.message.from_wire(out)


def query(name: str, rdtype: str = "A", **kw: Any) -> dns.message.Message:
    return dns.message.make_query(name, rdtype, **kw)


def records(tmp_path: Path) -> list[Any]:
    return [r for r in read_records(tmp_path / "audit.jsonl") if r["event"] == "decision"]


# ---- what leaves --------------------------------------------------------------------------


def test_allowed_name_is_answered_from_a_fresh_lower_cased_query(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    q = query("AlLoWeD.TeSt")
    r = ask(b, q.to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR and r.id == q.id
    assert r.question[0].name.labels == q.question[0].name.labels  # the client's spelling comes back
    assert [rr.to_text() for rr in r.answer[0]] == ["192.0.2.1"]
    assert r.answer[0].name.labels == (b"AlLoWeD", b"TeSt", b"")
    ((proto, sent),) = upstream.queries
    assert proto == "udp" and sent.question[0].name.labels == (b"allowed", b"test", b"")
    assert sent.flags & dns.flags.RD and sent.edns == 0 and sent.options == ()
    (rec,) = records(tmp_path)
    assert (rec["kind"], rec["action"], rec["host"], rec["qtype"], rec["port"]) == (
        "dns",
        "allow",
        "allowed.test",
        "A",
        None,
    )
    assert rec["rule"] == "test.yaml"


def test_edns_options_and_additional_records_are_not_forwarded(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    secret = b"exfiltrated-secret-token"
    q = query(
        "allowed.test",
        "TXT",
        use_edns=0,
        payload=4096,
        want_dnssec=True,
        options=[dns.edns.GenericOption(dns.edns.OptionType.make(65001), secret), dns.edns.ECSOption("10.1.2.0", 24)],
    )
    q.additional.append(dns.rrset.from_text("leak.test.", 60, "IN", "TXT", '"' + secret.decode() + '"'))
    r = ask(b, q.to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR
    ((_, sent),) = upstream.queries
    assert sent.options == () and sent.additional == [] and not sent.ednsflags & dns.flags.DO
    assert secret not in sent.to_wire()
    assert r.options == () and r.additional == []  # and nothing of ours or upstream's comes back in them


def test_answer_keeps_only_the_question_and_its_cname_chain(tmp_path: Path, upstream: FakeDns) -> None:
    r = ask(make_binding(tmp_path, upstream), query("chain.test").to_wire())
    assert r is not None
    got = sorted(rrset.to_text() for rrset in r.answer)
    assert got == [
        "cdn.elsewhere.test. 60 IN CNAME edge.cdn.test.",
        "chain.test. 60 IN CNAME cdn.elsewhere.test.",
        "edge.cdn.test. 60 IN A 192.0.2.7",
    ]
    assert r.authority == [] and r.additional == []


def test_upstream_rcode_and_tcp_fallback(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    r = ask(b, query("nx.test").to_wire())
    assert r is not None and r.rcode() == dns.rcode.NXDOMAIN
    r = ask(b, query("tc.test").to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR and r.answer
    assert [p for p, q in upstream.queries if q.question[0].name.labels[0] == b"tc"] == ["udp", "tcp"]


def test_udp_answer_too_large_for_the_client_is_truncated(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    r = ask(b, query("big.test", use_edns=False).to_wire())
    assert r is not None and r.flags & dns.flags.TC and r.answer == []
    r = ask(b, query("big.test", use_edns=False).to_wire(), tcp=True)
    assert r is not None and not r.flags & dns.flags.TC and len(r.answer[0]) == 59


def test_unreachable_upstream_is_servfail(tmp_path: Path, upstream: FakeDns) -> None:
    upstream.handler = lambda q, proto: None  # never answers
    r = ask(make_binding(tmp_path, upstream), query("allowed.test").to_wire())
    assert r is not None and r.rcode() == dns.rcode.SERVFAIL


# ---- what is refused without leaving -----------------------------------------------------------


def test_denied_names_are_refused_and_never_sent(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    for name, qtype in (
        ("blocked.test", "A"),
        ("c2VjcmV0.exfil.test", "TXT"),
        ("evil.wild.test", "A"),
        ("exfil.test", "ANY"),
        ("ask.test", "A"),
    ):
        r = ask(b, query(name, qtype).to_wire())
        assert r is not None and r.rcode() == dns.rcode.REFUSED, name
    assert upstream.queries == []
    recs = records(tmp_path)
    assert [(x["host"], x["action"]) for x in recs] == [
        ("blocked.test", "deny"),
        ("c2vjcmv0.exfil.test", "deny"),
        ("evil.wild.test", "deny"),
        ("exfil.test", "deny"),
        ("ask.test", "deny"),
    ]
    assert recs[3]["qtype"] == "ANY" and "no approval channel" in recs[4]["reason"]


def test_more_than_one_question_is_refused(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    q = query("allowed.test")
    q.question.append(dns.rrset.RRset(dns.name.from_text("blocked.test"), dns.rdataclass.IN, dns.rdatatype.A))
    r = ask(b, q.to_wire())
    assert r is not None and r.rcode() == dns.rcode.REFUSED and r.id == q.id
    assert upstream.queries == []
    (rec,) = records(tmp_path)
    assert rec["action"] == "deny" and "2 questions" in rec["reason"]


def test_update_and_other_opcodes_are_refused(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    u = dns.update.UpdateMessage("allowed.test.")
    u.add("www", 60, "A", "192.0.2.99")
    r = ask(b, u.to_wire())
    assert r is not None and r.rcode() == dns.rcode.REFUSED and r.opcode() == dns.opcode.UPDATE
    n = query("allowed.test")
    n.set_opcode(dns.opcode.NOTIFY)
    r = ask(b, n.to_wire())
    assert r is not None and r.rcode() == dns.rcode.REFUSED
    assert upstream.queries == []
    assert [x["reason"].split(" refused")[0] for x in records(tmp_path)] == ["opcode UPDATE", "opcode NOTIFY"]


def test_unparsable_messages(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    assert ask(b, b"\x12") is None  # not even a header: nothing to answer to
    garbage = struct.pack("!HHHHHH", 0xBEEF, 0x0100, 1, 0, 0, 0) + b"\x05abc"  # a question cut short
    out = asyncio.run(dnsgate.DnsGate().answer(b, garbage, None))
    assert out is not None
    qid, flags = struct.unpack_from("!HH", out)
    assert qid == 0xBEEF and flags & 0x8000 and flags & 0xF == dns.rcode.FORMERR and flags & 0x0100
    answer = dns.message.make_response(query("allowed.test")).to_wire()  # a response, not a query
    assert ask(b, answer) is None
    assert upstream.queries == []
    assert [x["action"] for x in records(tmp_path)] == ["deny", "deny", "deny"]


# ---- learn and ask ----------------------------------------------------------------------------


def test_learn_mode_forwards_default_deny_names_as_would_deny(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream, learn=True)
    r = ask(b, query("unknown.test").to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR and r.answer
    r = ask(b, query("evil.wild.test").to_wire())  # an explicit deny stays a deny in learn mode
    assert r is not None and r.rcode() == dns.rcode.REFUSED
    assert upstream.names() == ["unknown.test."]
    recs = records(tmp_path)
    assert (recs[0]["action"], recs[0]["would"]) == ("allow", "deny")
    assert (recs[1]["action"], recs[1]["would"]) == ("deny", None)


def test_ask_names_get_a_placeholder_and_are_not_looked_up(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream, ask_all=True, approver=Approver("/nonexistent.sock", 1))
    for name in ("ask.test", "Other.Test"):
        r = ask(b, query(name).to_wire())
        assert r is not None and r.rcode() == dns.rcode.NOERROR
        assert [rr.to_text() for rr in r.answer[0]] == [str(dnsgate.PENDING_ADDRESS)]
    r = ask(b, query("ask.test", "AAAA").to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR and r.answer == []
    assert upstream.queries == []
    assert all(x["action"] == "allow" and "placeholder" in x["reason"] for x in records(tmp_path))


# ---- serving sockets ------------------------------------------------------------------------


def serving(
    b: Binding, client: Callable[[int, int], list[dns.message.Message]]
) -> tuple[list[dns.message.Message], int]:
    """Serve `b` on fresh loopback UDP and TCP sockets while `client(udp_port, tcp_port)` asks (in a thread).

    Returns what it got, and the TCP port (closed again by then)."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    uport, tport = udp.getsockname()[1], tcp.getsockname()[1]

    async def main() -> list[dns.message.Message]:
        gate = dnsgate.DnsGate(timeout=2)
        services = [await dnsgate.serve_udp(udp, b, gate), await dnsgate.serve_tcp(tcp, b, gate)]
        try:
            return await asyncio.to_thread(client, uport, tport)
        finally:
            for s in services:
                s.close()

    return asyncio.run(main()), tport


def test_serve_udp_and_tcp_on_given_sockets(tmp_path: Path, upstream: FakeDns) -> None:
    def client(uport: int, tport: int) -> list[dns.message.Message]:
        return [udp_ask(uport, query("allowed.test")), *tcp_ask(tport, [query("sub.wild.test"), query("blocked.test")])]

    (a, s, blocked), tport = serving(make_binding(tmp_path, upstream), client)
    assert a.rcode() == s.rcode() == dns.rcode.NOERROR and blocked.rcode() == dns.rcode.REFUSED
    assert upstream.names() == ["allowed.test.", "sub.wild.test."]
    with pytest.raises(OSError):  # closed with its service
        socket.create_connection(("127.0.0.1", tport), timeout=1)


def test_a_refusal_says_why_in_an_extended_dns_error_to_clients_with_edns(tmp_path: Path, upstream: FakeDns) -> None:
    """RFC 8914: the REFUSED carries EDE 15 (Blocked) with the same line a 403 body says; no EDNS, no OPT."""
    edns = [query("PyPI.org", use_edns=0, payload=1232), query("evil.wild.test", use_edns=0)]
    edns.append(query("sub.wild.test", "TXT", use_edns=0))

    def client(uport: int, tport: int) -> list[dns.message.Message]:
        return [udp_ask(uport, q) for q in [*edns, query("pypi.org")]] + tcp_ask(tport, edns[:1])

    (blocked, denied, typed, plain, over_tcp), _ = serving(make_binding(tmp_path, upstream), client)
    assert all(r.rcode() == dns.rcode.REFUSED for r in (blocked, denied, typed, plain, over_tcp))
    for r, text in (
        (blocked, "sandgate: blocked pypi.org: no allow rule matches"),
        (over_tcp, "sandgate: blocked pypi.org: no allow rule matches"),
        (denied, "sandgate: blocked evil.wild.test: denied by rule evil.wild.test [test.yaml]"),
        (typed, "sandgate: blocked sub.wild.test: type TXT refused: sub.wild.test is allowed only by a wildcard rule"),
    ):
        (ede,) = r.options
        assert isinstance(ede, dns.edns.EDEOption) and ede.code == dns.edns.EDECode.BLOCKED
        assert r.edns == 0 and ede.text is not None and ede.text.startswith(text)
    assert [x["reason"] for x in records(tmp_path)[:2]] == ["no allow rule matches", "denied by rule evil.wild.test"]
    assert plain.edns == -1 and plain.options == () and plain.additional == []  # no EDNS asked: no OPT added
    long = ask(make_binding(tmp_path, upstream), query(".".join(["x" * 60] * 4), use_edns=0, payload=512).to_wire())
    assert long is not None and long.rcode() == dns.rcode.REFUSED  # 562 bytes with its reason: sent without
    assert long.edns == 0 and long.options == () and not long.flags & dns.flags.TC
    assert upstream.queries == []


# ---- query types: a wildcard allow is a channel to whoever runs that domain ------------------------


def test_the_upstream_query_is_built_fresh_whatever_the_client_sent(tmp_path: Path, upstream: FakeDns) -> None:
    """One question, lower-cased, RD only, EDNS without options: no client bit or byte rides along."""
    b = make_binding(tmp_path, upstream)
    q = query(
        "MiXeD.WiLd.TeSt",
        use_edns=0,
        payload=1232,
        options=[dns.edns.GenericOption(dns.edns.OptionType.make(65001), b"x" * 40)],
    )
    q.flags |= dns.flags.CD | dns.flags.AD
    r = ask(b, q.to_wire())
    assert r is not None and r.rcode() == dns.rcode.NOERROR and r.answer
    ((_, sent),) = upstream.queries
    assert len(sent.question) == 1 and sent.question[0].name.labels == (b"mixed", b"wild", b"test", b"")
    assert sent.flags == dns.flags.RD and sent.opcode() == dns.opcode.QUERY
    assert sent.options == () and sent.additional == [] and sent.answer == [] and sent.authority == []


def rcodes(b: Binding, *questions: tuple[str, str] | tuple[str, str, str]) -> list[str]:
    out = []
    for name, qtype, *rdclass in questions:
        r = ask(b, query(name, qtype, rdclass=rdclass[0] if rdclass else "IN").to_wire())
        assert r is not None
        out.append(dns.rcode.to_text(r.rcode()))
    return out


def sent(upstream: FakeDns) -> list[tuple[str, str]]:
    return [(q.question[0].name.to_text(), dns.rdatatype.to_text(q.question[0].rdtype)) for _, q in upstream.queries]


def test_wildcard_names_get_addresses_only_and_the_rest_is_refused_unsent(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    assert rcodes(b, ("sub.wild.test", "A"), ("sub.wild.test", "AAAA")) == ["NOERROR"] * 2
    r = ask(b, query("chain.wild.test").to_wire())  # the CNAME chain to the address comes along
    assert r is not None and [rrset.rdtype for rrset in r.answer] == [dns.rdatatype.CNAME] * 2 + [dns.rdatatype.A]
    secret, refused = "c2VjcmV0LXRva2Vu", ["TXT", "NULL", "MX", "SRV", "CNAME", "ANY", "NS", "PTR", "CAA"]
    assert rcodes(b, *((f"{secret}.wild.test", t) for t in refused)) == ["REFUSED"] * len(refused)
    for qtype in ("HTTPS", "SVCB"):  # answered empty here: clients fall back to A/AAAA at once
        r = ask(b, query("sub.wild.test", qtype).to_wire())
        assert r is not None and r.rcode() == dns.rcode.NOERROR and r.answer == [], qtype
    assert upstream.names() == ["sub.wild.test."] * 2 + ["chain.wild.test."]  # none of the refused or empty left
    recs = records(tmp_path)[3:]
    assert [(x["action"], x["qtype"]) for x in recs] == [("deny", t) for t in [*refused, "HTTPS", "SVCB"]]
    assert recs[0]["rule"] == "test.yaml" and recs[0]["reason"] == (
        f"type TXT refused: {secret.lower()}.wild.test is allowed only by a wildcard rule (allowed by rule "
        "*.wild.test:80,443), which serves A and AAAA; add 'dns: [TXT]' to that entry to allow it"
    )
    assert "answered empty" in recs[-1]["reason"]


def test_a_dns_list_on_the_wildcard_entry_lets_those_types_through(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream)
    r = ask(b, query("x.txt.test", "TXT").to_wire())
    assert r is not None and [rr.to_text() for rr in r.answer[0]] == ['"data from upstream"']
    assert rcodes(b, ("x.txt.test", "MX"), ("x.txt.test", "NULL")) == ["NOERROR", "REFUSED"]
    assert sent(upstream) == [("x.txt.test.", "TXT"), ("x.txt.test.", "MX")]


def test_exact_names_keep_every_type_and_other_classes_are_refused_for_wildcards(
    tmp_path: Path, upstream: FakeDns
) -> None:
    b = make_binding(tmp_path, upstream)
    types = ["TXT", "NULL", "HTTPS", "ANY", "MX"]
    assert rcodes(b, *(("allowed.test", t) for t in types)) == ["NOERROR"] * 5
    assert sent(upstream) == [("allowed.test.", t) for t in types]
    assert rcodes(b, ("version.wild.test", "TXT", "CH"), ("x.txt.test", "TXT", "CH")) == ["REFUSED"] * 2
    assert len(upstream.queries) == 5 and records(tmp_path)[-1]["reason"].startswith("class CH refused")


def test_learn_mode_forwards_a_refused_type_as_would_deny(tmp_path: Path, upstream: FakeDns) -> None:
    b = make_binding(tmp_path, upstream, learn=True)
    assert rcodes(b, ("sub.wild.test", "TXT")) == ["NOERROR"]
    assert upstream.names() == ["sub.wild.test."]
    (rec,) = records(tmp_path)
    assert (rec["action"], rec["would"]) == ("allow", "deny") and rec["reason"].startswith("learn mode: type TXT")

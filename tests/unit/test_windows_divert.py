"""The Windows redirect path, pure parts: filter strings (WinDivert's own compiler via pydivert),
the reflect rewrite, the NAT table, owner decisions, and the loop against a fake handle."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pydivert
import pytest

from netguard.windows import divertfilter, owners, redirect, reflect

SID_PID, HOST_PID = 100, 200
PROXY = 3129


#: WinDivert's filter compiler as the installed pydivert offers it: 4.0.1 (Linux, eBPFDivert's port of
#: it) has Divert.check_filter; 3.1.3, what mitmproxy's win32 pin gives the Windows runner, has
#: WinDivert.check_filter (WinDivertHelperCompileFilter itself). Both run in the workflow.
_CHECK = getattr(pydivert, "Divert", None) or pydivert.WinDivert


def test_filters_compile_in_their_layers() -> None:
    f = divertfilter.plan_filters(PROXY)
    assert _CHECK.check_filter(f.socket, pydivert.Layer.SOCKET)[0]
    assert _CHECK.check_filter(f.network, pydivert.Layer.NETWORK)[0]
    # Control: the checker rejects what it should (a socket-layer field at the network layer).
    assert not _CHECK.check_filter(f.socket, pydivert.Layer.NETWORK)[0]


def _raw_syn(src: str, sport: int, dst: str, dport: int, *, outbound: bool = True) -> pydivert.Packet:
    """An IPv4 TCP SYN built by hand (pydivert 3.1.3 has no PacketBuilder), with WinDivert's Loopback
    flag as the stack sets it on Windows."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0x4000, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x02, 65535, 0, 0)
    way = pydivert.Direction.OUTBOUND if outbound else pydivert.Direction.INBOUND
    p = pydivert.Packet(ip + tcp, direction=way, loopback=src.startswith("127."))
    assert p.tcp is not None and p.tcp.syn and (p.src_addr, p.dst_port) == (src, dport)
    return p


def test_the_network_filter_takes_off_host_tcp_and_never_loopback() -> None:
    net = divertfilter.outbound_tcp(PROXY)
    assert _raw_syn("10.0.0.1", 40000, "93.184.216.34", 443).matches(net)
    assert _raw_syn("10.0.0.1", PROXY, "93.184.216.34", 40000).matches(net)  # the proxy's replies
    assert not _raw_syn("127.0.0.1", 40000, "127.0.0.1", 3128).matches(net)  # explicit proxy: never looped
    assert not _raw_syn("10.0.0.1", 40000, "93.184.216.34", 443, outbound=False).matches(net)


def test_bad_ports_are_refused() -> None:
    with pytest.raises(divertfilter.DivertFilterError):
        divertfilter.plan_filters(0)


def test_reflect_there_and_back() -> None:
    syn = reflect.Fields("10.0.0.1", 40000, "93.184.216.34", 443, False)
    to = reflect.to_proxy(syn, PROXY)
    assert to == reflect.Fields("93.184.216.34", 40000, "10.0.0.1", PROXY, True)
    reply = reflect.Fields("10.0.0.1", PROXY, "93.184.216.34", 40000, False)  # proxy -> its peer
    assert reflect.from_proxy(reply, 443) == reflect.Fields("93.184.216.34", 443, "10.0.0.1", 40000, True)


def test_nat_gives_the_proxy_the_original_destination_and_refuses_collisions() -> None:
    nat = reflect.NatTable()
    a = reflect.Fields("10.0.0.1", 40000, "93.184.216.34", 443, False)
    assert nat.add(a) and nat.add(a)  # a retransmit is the same flow
    assert nat.for_peer("93.184.216.34", 40000) == reflect.Original("10.0.0.1", 40000, "93.184.216.34", 443)
    assert nat.has_client(a)
    # Same client port to the same address, other port: the proxy could not tell them apart.
    assert not nat.add(reflect.Fields("10.0.0.1", 40000, "93.184.216.34", 80, False))
    assert nat.for_peer("93.184.216.34", 40000) == reflect.Original("10.0.0.1", 40000, "93.184.216.34", 443)
    nat.forget("93.184.216.34", 40000)
    assert len(nat) == 0


SANDBOX_SID, OTHER_SID = "S-1-5-21-9-9-9-1002", "S-1-5-21-9-9-9-1001"
ESCAPED_PID = 300  # the sandbox user's, outside the job


def _look(pid: int) -> owners.Held:
    if pid == SID_PID:
        return owners.Held(owners.Owner("job", SANDBOX_SID))
    if pid == ESCAPED_PID:
        return owners.Held(owners.Owner("outside", SANDBOX_SID))
    return owners.Held(owners.Owner("outside", OTHER_SID))


def _owners() -> owners.Owners:
    return owners.Owners(_look, SANDBOX_SID)


JOB, OUT, UNKNOWN = "job", "outside", "unknown"


@pytest.mark.parametrize(
    ("membership", "sid", "verdict"),
    [
        (JOB, SANDBOX_SID, "reflect"),  # the command's
        (JOB, SANDBOX_SID.lower(), "reflect"),
        (JOB, OTHER_SID, "reflect"),  # in the job is the command's, whatever its token
        (JOB, None, "reflect"),  # its token unreadable: still the job's, to the proxy and its audit
        (OUT, OTHER_SID, "pass"),  # another user's: the machine's traffic, untouched
        (OUT, SANDBOX_SID, "drop"),  # escaped the job: neither passed (unaudited) nor reflected
        (OUT, SANDBOX_SID.lower(), "drop"),  # SIDs compare case-insensitively ("s-1-5-...")
        (OUT, None, "drop"),  # token unreadable: cannot tell whose
        (UNKNOWN, OTHER_SID, "drop"),  # membership unreadable
        (UNKNOWN, SANDBOX_SID, "drop"),
        (UNKNOWN, None, "drop"),  # could not be opened at all (gone, or refused)
    ],
)
def test_the_verdict_table(membership: owners.Membership, sid: str | None, verdict: str) -> None:
    assert owners.judge(owners.Owner(membership, sid), SANDBOX_SID) == verdict


def test_an_escaped_sandbox_process_is_dropped_and_stays_dropped() -> None:
    o = _owners()
    o.add(owners.ConnectEvent(ESCAPED_PID, "1.2.3.4", 443, 40000, 0.0))
    o.add(owners.ConnectEvent(SID_PID, "1.2.3.4", 443, 40001, 0.0))
    assert o.decide("1.2.3.4", 443, 40000, 0.1) == "drop"
    assert o.decide("1.2.3.4", 443, 40000, 1.0) == "drop"  # its retransmit too: the event is kept
    assert o.decide("1.2.3.4", 443, 40001, 0.1) == "reflect"  # the job's, same destination, same moment
    assert o.decide("1.2.3.4", 443, 40000, owners.EVENT_TTL + 1) == "unseen"  # expired at last
    # Without local ports, the escaped process and another user's to one destination: dropped.
    o.add(owners.ConnectEvent(ESCAPED_PID, "5.6.7.8", 80, 0, 20.0))
    o.add(owners.ConnectEvent(HOST_PID, "5.6.7.8", 80, 0, 20.0))
    assert o.decide("5.6.7.8", 80, 40002, 20.1) == "drop"


def test_a_lookup_is_kept_only_while_its_handle_pins_the_pid() -> None:
    """One lookup per pid while a handle is held (the pid cannot be reused then); released with
    the last event that needed it, or when the loop ends. A lookup without a handle (the process
    could not be opened) is never reused: that pid may be anybody's next time."""
    looked: list[int] = []
    released: list[int] = []

    def look(pid: int) -> owners.Held:
        looked.append(pid)
        if pid == 7:
            return owners.Held(owners.Owner("unknown", None))
        return owners.Held(owners.Owner("outside", OTHER_SID), 1000 + pid)

    o = owners.Owners(look, SANDBOX_SID, released.append)
    o.add(owners.ConnectEvent(5, "1.2.3.4", 443, 40000, 0.0))
    o.add(owners.ConnectEvent(5, "1.2.3.4", 443, 40001, 0.0))
    o.add(owners.ConnectEvent(7, "1.2.3.4", 443, 40002, 0.0))
    o.add(owners.ConnectEvent(7, "1.2.3.4", 443, 40003, 0.0))
    assert looked == [5, 7, 7] and o.held() == 1
    assert o.decide("1.2.3.4", 443, 40000, 0.1) == "pass" and released == []  # one event still needs it
    assert o.decide("1.2.3.4", 443, 40001, 0.1) == "pass" and released == [1005] and o.held() == 0
    o.add(owners.ConnectEvent(5, "9.9.9.9", 443, 40004, 1.0))
    assert looked[-1] == 5  # looked up again: the old handle is closed, the pid may be another process
    assert o.decide("1.2.3.4", 443, 40002, 0.2) == "drop"
    o.close()
    assert released == [1005, 1005] and o.held() == 0 and len(o) == 0


def test_expired_events_release_their_handles() -> None:
    released: list[int] = []
    o = owners.Owners(lambda pid: owners.Held(owners.Owner("job", None), 42), SANDBOX_SID, released.append)
    o.add(owners.ConnectEvent(5, "1.2.3.4", 443, 0, 0.0))
    assert o.decide("5.6.7.8", 443, 40000, owners.EVENT_TTL) == "unseen" and released == [42]


def test_owner_decisions() -> None:
    o = _owners()
    assert o.decide("1.2.3.4", 443, 40000, 0.0) == "unseen"  # unknown owner (the loop then drops)
    o.add(owners.ConnectEvent(SID_PID, "1.2.3.4", 443, 40000, 0.0))
    o.add(owners.ConnectEvent(HOST_PID, "1.2.3.4", 443, 40001, 0.0))
    assert o.decide("1.2.3.4", 443, 40001, 0.1) == "pass"  # exact local port wins
    assert o.decide("1.2.3.4", 443, 40000, 0.1) == "reflect"
    assert len(o) == 0  # each decision consumed its event


def test_without_local_ports_a_mix_is_dropped_and_agreement_decides() -> None:
    o = _owners()
    o.add(owners.ConnectEvent(SID_PID, "1.2.3.4", 443, 0, 0.0))
    o.add(owners.ConnectEvent(HOST_PID, "1.2.3.4", 443, 0, 0.0))
    assert o.decide("1.2.3.4", 443, 40000, 0.1) == "drop"  # could be either: never pass on a guess
    o2 = _owners()
    o2.add(owners.ConnectEvent(SID_PID, "1.2.3.4", 443, 0, 0.0))
    assert o2.decide("1.2.3.4", 443, 40000, 0.1) == "reflect"


def test_stale_events_expire() -> None:
    o = _owners()
    o.add(owners.ConnectEvent(SID_PID, "1.2.3.4", 443, 0, 0.0))
    assert o.decide("1.2.3.4", 443, 40000, owners.EVENT_TTL + 1) == "unseen"


def test_socket_layer_addresses() -> None:
    assert owners.address_from_words([0x0A4D0002, 0xFFFF, 0, 0]) == "10.77.0.2"  # seen from eBPFDivert
    assert owners.address_from_words([1, 0, 0, 0]) == "::1"
    assert owners.canonical("::ffff:10.77.0.2") == "10.77.0.2"
    assert owners.canonical("0:0::1") == "::1"


@dataclass
class FakeHandle:
    inbox: list[Any] = field(default_factory=list)
    sent: list[Any] = field(default_factory=list)

    def recv(self, bufsize: int = 0, timeout: float | None = None) -> Any:
        if not self.inbox:
            raise TimeoutError
        return self.inbox.pop(0)

    def send(self, packet: Any, recalculate_checksum: bool = True) -> int:
        self.sent.append(packet)
        return 1


def _event(pid: int, addr: str, port: int) -> Any:
    words = [int.from_bytes(bytes(int(x) for x in addr.split(".")), "big"), 0xFFFF, 0, 0]
    return SimpleNamespace(socket=SimpleNamespace(ProcessId=pid, RemoteAddr=words, RemotePort=port, LocalPort=0))


def _pkt(src: str, sport: int, dst: str, dport: int, *, syn: bool = False) -> Any:
    return SimpleNamespace(
        src_addr=src,
        src_port=sport,
        dst_addr=dst,
        dst_port=dport,
        direction=0,
        tcp=SimpleNamespace(syn=syn, ack=not syn, fin=False, rst=False),
    )


def test_the_loop_reflects_passes_drops_and_returns() -> None:
    net, sock = FakeHandle(), FakeHandle()
    r = redirect.Redirector(net, sock, PROXY, _owners(), clock=lambda: 0.0)
    sock.inbox += [_event(SID_PID, "1.2.3.4", 80), _event(HOST_PID, "5.6.7.8", 80)]
    r.take_events(0.0)
    syn = _pkt("10.0.0.1", 40000, "1.2.3.4", 80, syn=True)
    assert r.handle(syn) == "reflect"
    assert (syn.src_addr, syn.src_port, syn.dst_addr, syn.dst_port, syn.direction) == (
        "1.2.3.4",
        40000,
        "10.0.0.1",
        PROXY,
        1,
    )
    assert r.original("1.2.3.4", 40000) == reflect.Original("10.0.0.1", 40000, "1.2.3.4", 80)
    assert r.handle(_pkt("10.0.0.1", 40000, "1.2.3.4", 80, syn=True)) == "reflect"  # retransmit keeps it
    assert r.handle(_pkt("10.0.0.1", 40000, "1.2.3.4", 80)) == "reflect"  # its data segments
    reply = _pkt("10.0.0.1", PROXY, "1.2.3.4", 40000)
    assert r.handle(reply) == "return"
    assert (reply.src_addr, reply.src_port, reply.dst_addr, reply.dst_port) == ("1.2.3.4", 80, "10.0.0.1", 40000)
    other = _pkt("10.0.0.1", 40001, "5.6.7.8", 80, syn=True)
    assert r.handle(other) == "pass"
    assert (other.dst_addr, other.dst_port, other.direction) == ("5.6.7.8", 80, 0)  # unchanged
    stranger = _pkt("10.0.0.1", 40002, "9.9.9.9", 80, syn=True)
    assert r.handle(stranger) == "drop"
    assert stranger not in net.sent and other in net.sent
    assert (r.counters.reflect, r.counters.passed, r.counters.drop, r.counters.returned) == (3, 1, 1, 1)


def test_flows_are_forgotten_only_long_after_they_close() -> None:
    now = [0.0]
    net, sock = FakeHandle(), FakeHandle()
    r = redirect.Redirector(net, sock, PROXY, _owners(), clock=lambda: now[0])
    sock.inbox += [_event(SID_PID, "1.2.3.4", 80), _event(HOST_PID, "5.6.7.8", 80)]
    r.take_events(0.0)
    assert r.handle(_pkt("10.0.0.1", 40000, "1.2.3.4", 80, syn=True)) == "reflect"
    assert r.handle(_pkt("10.0.0.1", 40001, "5.6.7.8", 80, syn=True)) == "pass"
    now[0] = redirect.FLOW_TTL + 10  # a long-lived reflected flow is never forgotten while open
    assert r.handle(_pkt("10.0.0.1", 40000, "1.2.3.4", 80)) == "reflect"
    assert (("10.0.0.1", 40001, "5.6.7.8", 80)) not in r.decided  # the passed verdict expired
    fin = _pkt("10.0.0.1", 40000, "1.2.3.4", 80)
    fin.tcp.fin = True
    assert r.handle(fin) == "reflect"
    now[0] += redirect.FLOW_TTL / 2  # TIME_WAIT: a late segment still goes to the proxy, not out
    assert r.handle(_pkt("10.0.0.1", 40000, "1.2.3.4", 80)) == "reflect"
    now[0] += redirect.FLOW_TTL
    r.handle(_pkt("10.0.0.1", 40002, "9.9.9.9", 80))  # any packet runs the purge
    assert r.original("1.2.3.4", 40000) is None and not r.decided

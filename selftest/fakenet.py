"""The fake internet verify builds in its World: fake hosts, the canaries that log what reaches them,
the unix sockets outside, and the controls that prove each canary answers without the sandbox (so
that a blocked probe means sandgate blocked it)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from selftest import inspectnet, markers
from selftest.errors import VerifyError
from selftest.planted import root_device
from selftest.probes.core import CONTEXTS
from selftest.world import DUMMY_IF, Canary, World

ALLOWED, BLOCKED, ROGUE = "198.51.100.10", "198.51.100.20", "198.51.100.54"
ALLOWED_HOST, BLOCKED_HOST = "allowed.verify.test", "blocked.verify.test"
LOOPBACK_HOST, METADATA_HOST, EXFIL = "loopback.verify.test", "metadata.verify.test", "exfil.verify.test"
WILD_DOMAIN = "wild.verify.test"  # allowed only as *.wild.verify.test: A/AAAA forwarded, TXT/NULL/MX refused
#: An address the world (the proxy host) holds outside TEST-NET-2, so not exempt from the own-address veto.
OWN_IP, OWN_HOST = "203.0.113.77", "own.verify.test"
IDENTITIES = ("root", "user")
TCP_PORT, UDP_PORT, QUIC_PORT, OTHER_PORT, HOST_LOOPBACK_PORT = 9000, 9999, 443, 8080, 2222
SECRET_ENV, VISIBLE_ENV = "SANDGATE_VERIFY_TOKEN", "SANDGATE_VERIFY_VISIBLE"

POLICY = f"""\
# sandgate verify's own policy: the canaries it may reach (merged with any --policy given)
version: 1
network:
  allow:
    - {ALLOWED_HOST}
    - {LOOPBACK_HOST}     # allowed name that resolves to 127.0.0.1: the SSRF guard must refuse it
    - {METADATA_HOST}     # allowed name that resolves to 169.254.169.254
    - {OWN_HOST}          # allowed name that resolves to {OWN_IP}, an address of the proxy host itself
    - "*.{WILD_DOMAIN}"   # a wildcard: only address types may be asked for below it
{inspectnet.ALLOW}{inspectnet.CREDENTIALS}"""


@dataclass(frozen=True)
class WorldFacts:
    """What build_world made that the probes' spec names (the rest of the fake internet is constant)."""

    abstract_socket: str
    path_socket: str
    world_netns: str
    root_dev: tuple[int, int]
    root_dev_path: str
    inspect: inspectnet.InspectFacts


#: The fake hosts' canaries (the world's own DNS server aside), started all at once with the others.
CANARIES = (
    Canary("http", ALLOWED, 80, ALLOWED_HOST),
    Canary("https", ALLOWED, 443, ALLOWED_HOST),
    Canary("tcp", ALLOWED, OTHER_PORT, ALLOWED_HOST),
    Canary("http", BLOCKED, 80, BLOCKED_HOST),
    Canary("https", BLOCKED, 443, BLOCKED_HOST),
    Canary("tcp", BLOCKED, TCP_PORT, BLOCKED_HOST),
    Canary("udp", BLOCKED, UDP_PORT, BLOCKED_HOST),
    Canary("udp", BLOCKED, QUIC_PORT, BLOCKED_HOST),
    Canary("dns", ROGUE, 53, "rogue-resolver"),
    Canary("http", "127.0.0.1", 80, "loopback"),
    # the sandgate host's own loopback services: inside, 127.0.0.1 is the sandbox's
    Canary("tcp", "127.0.0.1", HOST_LOOPBACK_PORT, "host-loopback"),
    Canary("udp", "127.0.0.1", HOST_LOOPBACK_PORT, "host-loopback"),
    # on an address the world holds outside TEST-NET-2: the own-address veto's case
    Canary("http", OWN_IP, 80, OWN_HOST),
)


def build_world(w: World, scratch: Path, sockdir: Path, token: str) -> WorldFacts:
    """Fake hosts and canaries, shared by every pass: every address and name first, then all canaries at once
    (started one by one they cost each verify run seconds), then the controls that need them."""
    # A routing host is the worst case: without sandgate's rules, packets would reach the canaries.
    w.admin(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    w.add_host(ALLOWED_HOST, ALLOWED)
    w.add_host(BLOCKED_HOST, BLOCKED)
    w.add_host(LOOPBACK_HOST, "127.0.0.1")
    w.add_host(METADATA_HOST, "169.254.169.254")
    w.admin(["ip", "addr", "add", f"{OWN_IP}/32", "dev", DUMMY_IF])  # before its canary binds it
    w.add_host(OWN_HOST, OWN_IP)
    for ctx in CONTEXTS:  # the canary answers exact names only: the controls of wildcard_dns_types
        for who in IDENTITIES:
            w.add_host(wild_control(ctx, who), ALLOWED)
    abstract = f"sandgate-verify-{token}"
    path_sock = sockdir / "agent.sock"
    upstreams = inspectnet.prepare(w)
    canaries = [
        *CANARIES,
        Canary("abstract", path=abstract, name="abstract-socket"),  # the host's netns: where X11 and D-Bus listen
        Canary("unix", path=str(path_sock), name="path-socket"),
        *upstreams.canaries,
    ]
    started = dict(zip(canaries, w.serve_many(canaries), strict=True))
    _control_unix(w, ["\0" + abstract, str(path_sock)])
    _control_own_address(w)
    dev, dev_path = root_device()
    inspect = inspectnet.build(w, upstreams, started, (ALLOWED_HOST, ALLOWED))
    return WorldFacts(abstract, str(path_sock), str(w.netns_file(scratch / "world-netns")), dev, dev_path, inspect)


def wild_control(ctx: str, who: str) -> str:
    """The control name wildcard_dns_types asks for (an A query) in one context of one pass."""
    return markers.wild_control_name(markers.label("wildcard_dns_types", markers.mark(ctx, who)), WILD_DOMAIN)


OWN_CONTROL = """\
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(f"http://{sys.argv[1]}{sys.argv[3]}", timeout=5) as r:
    assert r.status == 200 and sys.argv[2].encode() in r.read(4096), r.status
"""


def _control_own_address(w: World) -> None:
    """Outside the sandbox the canary on OWN_IP (held outside TEST-NET-2) answers: so a refusal inside
    is the proxy's own-address veto."""
    path = markers.http_path("control", "rebind_own_address")
    r = w.run([sys.executable, "-c", OWN_CONTROL, OWN_IP, f"hello from {OWN_HOST}", path])
    if r.returncode != 0:
        raise VerifyError(f"the canary on {OWN_IP} does not answer even without the sandbox: {r.stderr.strip()[-300:]}")


CONTROL = """\
import socket, sys
for addr in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(addr.replace("\\\\0", "\\0"))
    s.sendall(b"verify:control\\n")
    assert s.recv(64).startswith(b"unix-canary"), addr
"""


def _control_unix(w: World, addrs: list[str]) -> None:
    """Outside the sandbox the unix canaries answer: so a blocked probe means sandgate blocked it."""
    r = w.run([sys.executable, "-c", CONTROL, *(a.replace("\0", "\\0") for a in addrs)])
    if r.returncode != 0:
        raise VerifyError(f"unix socket canaries are not reachable even without the sandbox: {r.stderr.strip()[-300:]}")

"""The sandbox's nftables table: built as text (pure), applied inside the sandbox's own network namespace.

v2: the table lives in the sandbox's network namespace, never in the host's. That namespace has
no link but `lo`; one route sends every destination to `lo`, and this table decides what the
packets become. Locally generated packets meet, in this order:

  output nat (-100)      DNS (udp/tcp 53, any IPv4 address) -> our DNS listener on 127.0.0.1:53;
                         loopback destinations stay loopback (a test suite's own servers);
                         the explicit-proxy port on 127.0.0.1 stays; every other TCP -> the
                         transparent listener (all ports, all addresses: the proxy decides by name)
  output filter (0)      replies of accepted connections, loopback, the listeners: accepted;
                         IPv6, non-DNS UDP, ICMP, everything else: counted into the `dropped`
                         sets (-> `kind: packet` audit records) and dropped

Fail closed by construction: the listeners' other end is the daemon; if it dies they close and
redirected connections are refused. Even without this table (flushed by a command that somehow
held CAP_NET_ADMIN) there is no link out of the namespace: packets go to `lo` and die there.

libnftables is called through ctypes (one in-process call, ~1 ms) instead of spawning `nft`.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass

TABLE = "sandgate"


class NftError(Exception):
    """libnftables missing or refusing our table; the message says which and what to install."""


@dataclass(frozen=True)
class Ports:
    """The listener ports inside the sandbox (all on 127.0.0.1)."""

    regular: int = 3128
    transparent: int = 3129
    dns: int = 53


def build_ruleset(p: Ports) -> str:
    """The table as nft script text; pure so tests can read exactly what would be installed.

    There is no weakened variant: the self-test's "firewall" weakening (SANDGATE_INTERNAL_WEAKEN)
    gives the sandbox no network namespace of its own instead, so this table is never installed.
    """
    redirect = f"    meta l4proto tcp redirect to :{p.transparent}\n"
    drops = """\
    meta nfproto ipv6 update @dropped6 { ip6 daddr . meta l4proto } drop
    meta l4proto udp update @dropped4 { ip daddr . meta l4proto . udp dport } drop
    meta l4proto tcp update @dropped4 { ip daddr . meta l4proto . tcp dport } drop
    update @dropped4x { ip daddr . meta l4proto } drop
"""
    return f"""\
table inet {TABLE} {{
  set dropped4 {{ type ipv4_addr . inet_proto . inet_service; flags dynamic; counter; size 65536; }}
  set dropped4x {{ type ipv4_addr . inet_proto; flags dynamic; counter; size 65536; }}
  set dropped6 {{ type ipv6_addr . inet_proto; flags dynamic; counter; size 65536; }}

  chain steer {{
    type nat hook output priority -100; policy accept;
    meta nfproto ipv4 meta l4proto {{ tcp, udp }} th dport 53 redirect to :{p.dns}
    ip daddr 127.0.0.0/8 accept
{redirect}  }}

  chain guard {{
    type filter hook output priority 0; policy accept;
    ct state established,related accept
    ip daddr 127.0.0.0/8 accept
{drops}  }}
}}
"""


class Nft:
    """A libnftables context in the calling process's network namespace."""

    NFT_CTX_OUTPUT_JSON = 1 << 4

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libnftables.so.1")  # not find_library(): it spawns ldconfig on every run
        except OSError:
            raise NftError("libnftables not found; install nftables (apt-get install nftables)") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for fn in ("nft_ctx_buffer_output", "nft_ctx_buffer_error", "nft_ctx_free"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self._ctx = lib.nft_ctx_new(0)
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)

    def run(self, text: str, *, json_output: bool = False) -> str:
        """Run nft script text as one transaction: all of it applies or none."""
        self._lib.nft_ctx_output_set_flags(self._ctx, self.NFT_CTX_OUTPUT_JSON if json_output else 0)
        rc = self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode())
        out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
        if rc != 0:
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
            raise NftError(f"nftables refused the sandbox table: {err.strip() or 'error'}")
        return out

    def apply(self, p: Ports) -> None:
        self.run(build_ruleset(p))

    def dropped(self) -> list[tuple[str, str, int | None, int]]:
        """(destination, protocol, port or None, packets) for every packet the table dropped so far."""
        try:
            return parse_set_elements(self.run(f"list table inet {TABLE}", json_output=True))
        except (NftError, ValueError):
            return []


def parse_set_elements(text: str) -> list[tuple[str, str, int | None, int]]:
    """Elements of the `dropped*` sets in `nft -j list table|set` output (pure)."""
    out: list[tuple[str, str, int | None, int]] = []
    for item in json.loads(text).get("nftables", []):
        s = item.get("set")
        if not s:
            continue
        for elem in s.get("elem", []):
            packets = 0
            if isinstance(elem, dict) and "elem" in elem:
                packets = int(elem["elem"].get("counter", {}).get("packets", 0))
                elem = elem["elem"]["val"]
            parts = elem["concat"]
            dst, proto = str(parts[0]), str(parts[1])
            port = int(parts[2]) if len(parts) > 2 else None
            out.append((dst, proto, port, packets))
    return out

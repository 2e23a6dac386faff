"""r3-new N2 and N3: the real session effects (launcher/run/windows/win32runsession.py) under Windows' rules.

N3: Winsock's bind rules (https://learn.microsoft.com/en-us/windows/win32/winsock/using-so-reuseaddr-and-so-exclusiveaddruse):
"The SO_REUSEADDR socket option allows a socket to forcibly bind to a port in use by another socket",
enhanced socket security stops only another account ("The only exception ... when the second bind call
is performed by the same user account"), and SO_EXCLUSIVEADDRUSE "prevents other sockets from being
forcibly bound to the same address and port". Linux cannot show that, so a fake socket module applies it.

N2: ssl.enum_certificates (Windows only, https://docs.python.org/3/library/ssl.html#ssl.enum_certificates)
returns (cert bytes, "x509_asn" | "pkcs_7_asn", True | set of OIDs); Windows' ROOT store holds only the
roots fetched so far, so certifi's (what pip, requests and git's OpenSSL trust outside) join them.
"""

from __future__ import annotations

import ssl
from types import SimpleNamespace
from typing import Any

import certifi
import pytest

from launcher.run.windows import trust, win32runsession
from launcher.run.windows.win32runsession import RealSessionApi
from sgbase.windows.api import WinApiError

WSAEADDRINUSE = 10048
SO_REUSEADDR, SO_EXCLUSIVEADDRUSE = 4, ~4  # winsock2.h: SO_EXCLUSIVEADDRUSE ((int)(~SO_REUSEADDR))


class Winsock:
    """Bound addresses of one account, with the doc's rules for a second bind (same account)."""

    def __init__(self) -> None:
        self.bound: dict[tuple[str, int], list[FakeSocket]] = {}
        self.refuse_exclusive = False  # an exclusive bind refused (connections lingering: not documented)

    def bind(self, sock: FakeSocket, addr: tuple[str, int]) -> None:
        holders = [s for s in self.bound.get(addr, []) if not s.closed]
        if sock.exclusive and self.refuse_exclusive:
            raise OSError(WSAEADDRINUSE, "address in use")
        if holders and (sock.exclusive or not sock.reuse or any(h.exclusive for h in holders)):
            raise OSError(WSAEADDRINUSE, "address in use")
        self.bound.setdefault(addr, []).append(sock)


class FakeSocket:
    fd = 100

    def __init__(self, net: Winsock, family: int, kind: int) -> None:
        self.net, self.exclusive, self.reuse, self.closed = net, False, False, False
        FakeSocket.fd += 1
        self._fd = FakeSocket.fd

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.exclusive |= option == SO_EXCLUSIVEADDRUSE and bool(value)
        self.reuse |= option == SO_REUSEADDR and bool(value)

    def bind(self, addr: tuple[str, int]) -> None:
        self.net.bind(self, addr)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def winsock(monkeypatch: pytest.MonkeyPatch) -> Winsock:
    net = Winsock()
    fake = SimpleNamespace(
        AF_INET=2, AF_INET6=23, SOCK_STREAM=1, SOL_SOCKET=0xFFFF, SO_REUSEADDR=SO_REUSEADDR,
        SO_EXCLUSIVEADDRUSE=SO_EXCLUSIVEADDRUSE, socket=lambda family, kind: FakeSocket(net, family, kind),
    )  # fmt: skip
    monkeypatch.setattr(win32runsession, "socket", fake)
    return net


def _other_program(net: Winsock, reuse: bool) -> FakeSocket:
    """A program of the real user binding 127.0.0.1:3128 during the run."""
    sock = FakeSocket(net, 2, 1)
    if reuse:
        sock.setsockopt(0xFFFF, SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 3128))
    return sock


def test_the_hold_is_exclusive_a_same_account_reuseaddr_bind_is_refused(winsock: Winsock) -> None:
    api = RealSessionApi()
    handle = api.hold_port(3128)
    with pytest.raises(OSError):
        _other_program(winsock, reuse=True)
    with pytest.raises(OSError):
        _other_program(winsock, reuse=False)
    api.release_port(handle)
    _other_program(winsock, reuse=False)  # the matching permitted bind: released, free again


def test_an_exclusive_bind_refused_falls_back_to_a_plain_hold(winsock: Winsock) -> None:
    winsock.refuse_exclusive = True
    handle = RealSessionApi().hold_port(3128)
    assert [s.exclusive for s in winsock.bound[("127.0.0.1", 3128)]] == [False]
    with pytest.raises(OSError):
        _other_program(winsock, reuse=False)  # still held against a plain bind
    assert handle


def test_a_live_holder_still_refuses_the_run(winsock: Winsock) -> None:
    _other_program(winsock, reuse=True)
    with pytest.raises(WinApiError, match="in use"):
        RealSessionApi().hold_port(3128)


def _mozilla() -> list[str]:
    with open(certifi.where(), encoding="ascii") as f:
        return trust.certificates(f.read())


def _der(pem: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem)


def _stores(root: str, client_only: str) -> dict[str, list[tuple[bytes, str, Any]]]:
    return {
        "ROOT": [(_der(root), "x509_asn", True), (b"\x30\x00", "pkcs_7_asn", True)],
        "CA": [(_der(client_only), "x509_asn", {"1.3.6.1.5.5.7.3.2"})],  # client auth only: not a TLS root
    }


def test_system_roots_add_mozillas_to_the_stores_server_auth_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    mozilla = _mozilla()
    stores = _stores(mozilla[0], mozilla[1])
    monkeypatch.setattr(ssl, "enum_certificates", lambda store: stores[store], raising=False)
    blocks = trust.certificates("".join(RealSessionApi().system_roots()))
    assert blocks[0] == trust.certificates(ssl.DER_cert_to_PEM_cert(_der(mozilla[0])))[0]  # the store first
    assert mozilla[-1] in blocks  # a root the store has not fetched yet


def test_the_stores_own_filter_is_cpythons(monkeypatch: pytest.MonkeyPatch) -> None:
    """The matching control without certifi: the store's server-auth x509 roots only, as load_default_certs."""
    mozilla = _mozilla()
    stores = _stores(mozilla[0], mozilla[1])
    monkeypatch.setattr(ssl, "enum_certificates", lambda store: stores[store], raising=False)
    monkeypatch.setattr(win32runsession, "_mozilla_roots", lambda: [])
    blocks = trust.certificates("".join(RealSessionApi().system_roots()))
    assert blocks == trust.certificates(ssl.DER_cert_to_PEM_cert(_der(mozilla[0])))

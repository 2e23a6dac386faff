"""The real WinApi's effects on this logon session that a run adds before CMD starts (session 38,
r2-user): the sandbox SID denied what the real user's logon SID would open to CMD (U3,
fsguard/windows/win32logonreach.py), and the machine's TLS roots for an inspecting run's bundle (U2,
launcher/run/windows/trust.py), and the proxy port held by a run without a proxy (U4). Apart from realapi.py for its size. Never run yet.
"""

from __future__ import annotations

import errno
import socket
import ssl

from fsguard.windows import win32logonreach
from sgbase.windows.api import WinApiError

SERVER_AUTH = "1.3.6.1.5.5.7.3.1"  # the extended key usage a TLS server root must allow
#: ::1 that cannot be bound (IPv6 off): nothing else can listen there either (winsock WSAEADDRNOTAVAIL).
NO_ADDRESS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, 10049, 10047)


class _NoSocket(OSError):
    """socket() itself failed (no such protocol stack), not the bind."""


def _bound(family: int, host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), SO_EXCLUSIVEADDRUSE first (r3-new N3): a plain bind lets a socket of
    the same account bind over it with SO_REUSEADDR and take CMD's connections ("The only exception ...
    when the second bind call is performed by the same user account", Using SO_REUSEADDR and
    SO_EXCLUSIVEADDRUSE). Plain when the exclusive bind is refused (an earlier run's connections may still
    linger there): a plain bind still fails over any live socket. The last bind error is raised."""
    exclusive = getattr(socket, "SO_EXCLUSIVEADDRUSE", None)  # Windows only
    for option in (exclusive, None) if exclusive is not None else (None,):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            raise _NoSocket(e.errno, e.strerror) from None
        try:
            if option is not None:
                sock.setsockopt(socket.SOL_SOCKET, option, 1)
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
            if option is None:
                raise  # the exclusive bind refused: the plain one decides
    raise AssertionError("unreachable")


def _mozilla_roots() -> list[str]:
    """certifi's roots (installed with mitmproxy): what pip, requests and Git for Windows' OpenSSL backend
    trust outside. Windows' ROOT store holds only the roots it fetched so far, the rest come "when needed"
    through CryptoAPI, which OpenSSL never asks (r3-new N2)."""
    try:
        import certifi

        with open(certifi.where(), encoding="ascii", errors="replace") as f:
            return [f.read()]
    except (ImportError, OSError):
        return []


class RealSessionApi:
    """Mixed into RealWinApi."""

    def deny_logon_reach(self, sid: str, pids: tuple[int, ...]) -> int:
        try:
            return win32logonreach.deny_reach(sid, pids)
        except OSError as e:  # Win32Error is one
            raise WinApiError(
                f"denying the sandbox user this desktop and sandgate's processes: {e.strerror or e}"
            ) from None

    def system_roots(self) -> tuple[str, ...]:
        """The ROOT and CA stores' server-auth certificates as PEM: what CPython's load_default_certs
        trusts on Windows (ssl.enum_certificates is Windows-only, so looked up when called), then
        Mozilla's (certifi) that CMD's OpenSSL-based tools trust by default."""
        enum = getattr(ssl, "enum_certificates", None)
        if enum is None:
            raise WinApiError("reading the Windows certificate store needs Windows")
        out: list[str] = []
        try:
            for store in ("ROOT", "CA"):
                for cert, encoding, trust in enum(store):
                    if encoding == "x509_asn" and (trust is True or SERVER_AUTH in trust):
                        out.append(ssl.DER_cert_to_PEM_cert(cert))
        except OSError as e:
            raise WinApiError(f"reading the Windows certificate store: {e.strerror or e}") from None
        return tuple(dict.fromkeys([*out, *_mozilla_roots()]))

    def hold_port(self, port: int) -> int:
        """127.0.0.1:port and [::1]:port bound, never listening: CMD's connect there is refused, and no
        other sandgate run's proxy can bind it while this run lasts (U4), exclusively where Windows allows
        (_bound). One line if taken."""
        held: list[socket.socket] = []
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                sock = _bound(family, host, port)
            except _NoSocket as e:
                if family == socket.AF_INET6:
                    continue  # no IPv6 stack: nothing can listen on ::1 either
                raise WinApiError(f"cannot hold {host} port {port}: {e.strerror or e}") from None
            except OSError as e:
                if family == socket.AF_INET6 and e.errno in NO_ADDRESS:
                    continue
                for other in held:
                    other.close()
                raise WinApiError(f"{host} port {port} is in use ({e.strerror or e})") from None
            held.append(sock)
        self.__dict__.setdefault("_held", {})[held[0].fileno()] = held
        return held[0].fileno()

    def release_port(self, handle: int) -> None:
        for sock in self.__dict__.setdefault("_held", {}).pop(handle, []):
            sock.close()

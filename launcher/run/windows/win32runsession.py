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
        trusts on Windows (ssl.enum_certificates is Windows-only, so looked up when called)."""
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
        return tuple(dict.fromkeys(out))

    def hold_port(self, port: int) -> int:
        """127.0.0.1:port and [::1]:port bound, never listening: CMD's connect there is refused, and no
        other sandgate run's proxy can bind it while this run lasts (U4). A plain bind, as the proxy's:
        SO_EXCLUSIVEADDRUSE "cannot necessarily be reused immediately after socket closure" while an
        earlier run's connections linger (Using SO_REUSEADDR and SO_EXCLUSIVEADDRUSE). One line if taken."""
        held: list[socket.socket] = []
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as e:
                if family == socket.AF_INET6:
                    continue  # no IPv6 stack: nothing can listen on ::1 either
                raise WinApiError(f"cannot hold {host} port {port}: {e.strerror or e}") from None
            try:
                sock.bind((host, port))
            except OSError as e:
                sock.close()
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

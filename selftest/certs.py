"""Throwaway X.509 certificates for the fake internet (selftest/world.py): one CA, leaves on demand.

    ca = CA()                                  # fresh ECDSA P-256 key, self-signed, valid 30 days
    ca.write_cert(tmp / "ca.pem")              # the trust anchor clients are given (curl --cacert)
    leaf = ca.issue("a.test", "*.wild.test", "198.51.100.10")
    chain_pem, key_pem = leaf.write(tmp / "a.chain.pem", tmp / "a.key.pem")

The CA's private key exists only in this process's memory and is never written anywhere, so the
CA cannot sign anything after its World is gone even if its certificate leaks into a trust store.
The certificates are netguard.tlscerts's, the same profile as the inspection CA's and leaves
(path length 0, critical basicConstraints and keyUsage, SKI/AKI, serverAuth only, names only in
the subjectAltName): they satisfy strict verifiers such as OpenSSL 3 with X509_V_FLAG_X509_STRICT.
Unlike the inspection CA this one is not name-constrained: it signs IP literals and any fake name.
"""

from __future__ import annotations

import datetime
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from netguard import tlscerts

DEFAULT_DAYS = 30
_BACKDATE = datetime.timedelta(days=1)  # tolerate a client clock slightly behind ours
_ORG = "sandgate throwaway"


def _write(path: Path | str, data: bytes, mode: int) -> Path:
    """Create or replace `path` with `mode` from the start (a key is never briefly world-readable)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)
    return path


@dataclass(frozen=True)
class Leaf:
    """A server certificate issued by a CA; the CA signs leaves directly, so the chain is the leaf."""

    names: tuple[str, ...]
    cert_pem: bytes  # PEM certificate chain (just the leaf)
    key_pem: bytes  # PEM PKCS#8 private key, unencrypted

    def write(self, chain_path: Path | str, key_path: Path | str) -> tuple[Path, Path]:
        """Write the chain (0644) and the key (0600); returns (chain_path, key_path)."""
        return _write(chain_path, self.cert_pem, 0o644), _write(key_path, self.key_pem, 0o600)


class CA:
    """A self-signed root that lives as long as this object; see the module docstring."""

    def __init__(self, name: str = "sandgate throwaway CA", *, days: int = DEFAULT_DAYS) -> None:
        now = datetime.datetime.now(datetime.UTC)
        # A random suffix tells the CAs of concurrent or successive worlds apart in error messages.
        subject = tlscerts.subject(_ORG, f"{name} {secrets.token_hex(4)}")
        valid = tlscerts.Validity(now - _BACKDATE, now + datetime.timedelta(days=days))
        self._authority = tlscerts.ca(tlscerts.new_key(), subject, valid, only=None)
        self.days = days

    def __repr__(self) -> str:
        return f"<CA {self.subject}>"

    @property
    def subject(self) -> str:
        return self._authority.cert.subject.rfc4514_string()

    @property
    def certificate(self) -> x509.Certificate:
        return self._authority.cert

    @property
    def cert_pem(self) -> bytes:
        """The PEM trust anchor to hand to clients."""
        return tlscerts.cert_pem(self._authority.cert)

    def write_cert(self, path: Path | str) -> Path:
        """Write the CA certificate (not its key: that never leaves memory) as PEM, mode 0644."""
        return _write(path, self.cert_pem, 0o644)

    def issue(self, *names: str, days: int | None = None) -> Leaf:
        """A leaf for DNS names (IDNs and "*.x" wildcards fine) and/or IP literals, all in subjectAltName."""
        if not names:
            raise ValueError("a certificate needs at least one name")
        sans = [tlscerts.general_name(n, wildcard=True) for n in names]
        now = datetime.datetime.now(datetime.UTC)
        wanted = tlscerts.Validity(now - _BACKDATE, now + datetime.timedelta(days=self.days if days is None else days))
        key = tlscerts.new_key()
        cert = tlscerts.leaf(
            self._authority, key, tlscerts.subject(_ORG), sans, tlscerts.within(self._authority, wanted, now)
        )
        return Leaf(tuple(names), tlscerts.cert_pem(cert), tlscerts.key_pem(key))

"""Throwaway X.509 certificates for the fake internet (selftest/world.py): one CA, leaves on demand.

    ca = CA()                                  # fresh ECDSA P-256 key, self-signed, valid 30 days
    ca.write_cert(tmp / "ca.pem")              # the trust anchor clients are given (curl --cacert)
    leaf = ca.issue("a.test", "*.wild.test", "198.51.100.10")
    chain_pem, key_pem = leaf.write(tmp / "a.chain.pem", tmp / "a.key.pem")

The CA's private key exists only in this process's memory and is never written anywhere, so the
CA cannot sign anything after its World is gone even if its certificate leaks into a trust store;
its basicConstraints path length is 0, so it cannot mint intermediate CAs either. The extensions
(SKI/AKI, critical basicConstraints and keyUsage, serverAuth/clientAuth EKU, names only in the
subjectAltName) satisfy strict verifiers such as OpenSSL 3 with X509_V_FLAG_X509_STRICT.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import idna
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 30
_BACKDATE = datetime.timedelta(days=1)  # tolerate a client clock slightly behind ours
_ORG = "sandgate throwaway"


def _general_name(name: str) -> x509.GeneralName:
    """An IP literal becomes an iPAddress SAN; anything else a dNSName (A-labels; "*." wildcards kept)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"certificate names must be non-empty strings, not {name!r}")
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    host = name.rstrip(".")
    if host.startswith("*."):
        return x509.DNSName("*." + idna.encode(host[2:], uts46=True).decode("ascii"))
    return x509.DNSName(idna.encode(host, uts46=True).decode("ascii"))


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


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
    """A server/client certificate issued by a CA; the CA signs leaves directly, so the chain is the leaf."""

    names: tuple[str, ...]
    cert_pem: bytes  # PEM certificate chain (just the leaf)
    key_pem: bytes  # PEM PKCS#8 private key, unencrypted

    def write(self, chain_path: Path | str, key_path: Path | str) -> tuple[Path, Path]:
        """Write the chain (0644) and the key (0600); returns (chain_path, key_path)."""
        return _write(chain_path, self.cert_pem, 0o644), _write(key_path, self.key_pem, 0o600)


class CA:
    """A self-signed root that lives as long as this object; see the module docstring."""

    def __init__(self, name: str = "sandgate throwaway CA", *, days: int = DEFAULT_DAYS) -> None:
        self._key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        # A random suffix tells the CAs of concurrent or successive worlds apart in error messages.
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
                x509.NameAttribute(NameOID.COMMON_NAME, f"{name} {secrets.token_hex(4)}"),
            ]
        )
        ski = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self._aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        self.days = days

    def __repr__(self) -> str:
        return f"<CA {self.subject}>"

    @property
    def subject(self) -> str:
        return self._cert.subject.rfc4514_string()

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    @property
    def cert_pem(self) -> bytes:
        """The PEM trust anchor to hand to clients."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def write_cert(self, path: Path | str) -> Path:
        """Write the CA certificate (not its key: that never leaves memory) as PEM, mode 0644."""
        return _write(path, self.cert_pem, 0o644)

    def issue(self, *names: str, days: int | None = None) -> Leaf:
        """A leaf for DNS names (IDNs and "*.x" wildcards fine) and/or IP literals, all in subjectAltName."""
        if not names:
            raise ValueError("a certificate needs at least one name")
        sans = [_general_name(n) for n in names]
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        not_after = min(
            now + datetime.timedelta(days=self.days if days is None else days), self._cert.not_valid_after_utc
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(self._aki, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Leaf(tuple(names), cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

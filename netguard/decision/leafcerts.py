"""Leaf certificates for inspected hosts, issued from the run's CA (netguard.spec.CaPair).

The CA pair is parsed once per sandbox (an Issuer); each host name gets its own leaf, with a
fresh EC P-256 key, cached so a busy host is not re-signed per connection. Pure: cryptography
only, nothing is read from or written to disk; a leaf's key lives only in this process.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

import idna
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LEAF_DAYS = 7  # a leaf outlives no run by much; it is also clipped to the CA's validity
MAX_CACHED = 256  # leaves kept per sandbox: a client naming endless hosts cannot grow memory without bound
_BACKDATE = datetime.timedelta(hours=1)  # tolerate a client clock slightly behind ours

CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class LeafError(ValueError):
    """The CA pair is unusable (not PEM, key does not match, not a CA, expired) or the name is not one."""


@dataclass(frozen=True)
class Leaf:
    """A server certificate for one name and its private key (never serialised by this module)."""

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _load(cert_pem: str, key_pem: str) -> tuple[x509.Certificate, CaKey]:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as e:
        raise LeafError(f"the inspection CA is not a PEM certificate and unencrypted key: {e}") from None
    if not isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise LeafError("the inspection CA key must be EC or RSA")
    pub = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if pub != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise LeafError("the inspection CA key does not match its certificate")
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise LeafError("the inspection CA certificate is not a CA (basicConstraints ca=true missing)")
    return cert, key


def san(name: str) -> x509.GeneralName:
    """The subjectAltName entry for a host: iPAddress for an IP literal, else an A-label dNSName."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return x509.DNSName(idna.encode(name.rstrip("."), uts46=True).decode("ascii"))
    except idna.IDNAError as e:
        raise LeafError(f"not a host name: {name!r} ({e})") from None


class Issuer:
    """Signs leaves with one sandbox's CA; parse the pair once, then `leaf(name)` per connection."""

    def __init__(self, cert_pem: str, key_pem: str, *, max_cached: int = MAX_CACHED) -> None:
        self.ca, self._key = _load(cert_pem, key_pem)
        self.max_cached = max_cached
        self._cache: OrderedDict[str, Leaf] = OrderedDict()
        try:
            ski = self.ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            self._aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        except x509.ExtensionNotFound:
            self._aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key())

    def leaf(self, name: str, now: datetime.datetime | None = None) -> Leaf:
        """The cached leaf for `name`, issued anew when missing or within a day of expiring."""
        now = now or datetime.datetime.now(datetime.UTC)
        hit = self._cache.get(name)
        if hit is not None and hit.cert.not_valid_after_utc - now > datetime.timedelta(days=1):
            self._cache.move_to_end(name)
            return hit
        leaf = self._issue(name, now)
        self._cache[name] = leaf
        self._cache.move_to_end(name)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return leaf

    def _issue(self, name: str, now: datetime.datetime) -> Leaf:
        alt = san(name)
        not_before = max(now - _BACKDATE, self.ca.not_valid_before_utc)
        not_after = min(now + datetime.timedelta(days=LEAF_DAYS), self.ca.not_valid_after_utc)
        if not_after <= now:
            raise LeafError("the inspection CA has expired")
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandgate inspection")]
        cn = alt.value if isinstance(alt, x509.DNSName) else str(alt.value)
        if len(cn) <= 64:  # the CN's upper bound; clients match on the SAN anyway
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(self._aki, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Leaf(name, cert, key)

"""Every X.509 certificate sandgate makes, built here: CAs and the server certificates they sign.

Three callers: the launcher's per-run inspection CA (launcher/run/inspection.py), the daemon's
leaves for inspected hosts (netguard/proxy/leafcerts.py), and the self-test's throwaway CA and
server certificates for its fake internet (launcher/selftest/certs.py). Pure: keys and parameters
in, cryptography objects and PEM bytes out; no file, no clock (callers pass the times), no cache.

What makes a certificate safe is defined once, below, each part named for the threat it defends
against; callers choose names, subjects and lifetimes, never extensions.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import idna
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey  # a CA given to the daemon may be either
MAX_CN = 64  # RFC 5280's upper bound for a commonName

# A CA signs leaves directly and nothing else: path length 0, so a leaked CA key cannot mint an
# intermediate that itself escapes the CA's constraints or lifetime.
CA_BASIC_CONSTRAINTS = x509.BasicConstraints(ca=True, path_length=0)
# The CA key signs certificates and CRLs only: nothing it signs can pass as a TLS handshake signature.
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)
# A leaf is no CA: a leaf key read from a process's memory cannot sign certificates.
LEAF_BASIC_CONSTRAINTS = x509.BasicConstraints(ca=False, path_length=None)
# A leaf key only signs handshakes (ECDHE), never certificates or CRLs.
LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)
# Server authentication only: a leaf cannot log in anywhere as a TLS client nor sign code or mail.
LEAF_EXTENDED_KEY_USAGE = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
# No IP address at all under a name-constrained CA: a leaked CA cannot sign for a bare address.
NO_ADDRESSES = (
    x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
    x509.IPAddress(ipaddress.ip_network("::/0")),
)


class CertError(ValueError):
    """A CA pair that cannot sign (not PEM, key does not match, not a CA, expired) or a name that is none."""


@dataclass(frozen=True)
class Validity:
    """A certificate's lifetime, both ends timezone-aware."""

    not_before: datetime.datetime
    not_after: datetime.datetime

    def __post_init__(self) -> None:
        if self.not_after <= self.not_before:
            raise CertError(f"a certificate must end after it starts ({self.not_before} .. {self.not_after})")


@dataclass(frozen=True)
class Authority:
    """A CA able to sign: its certificate and the private key that matches it."""

    cert: x509.Certificate
    key: CaKey


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh EC P-256 key: every client accepts it, and it is made in well under a millisecond."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: CaKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM (the caller decides where it may go)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def subject(organization: str, common_name: str | None = None) -> x509.Name:
    """O=organization, and CN=common_name when given (clients match hosts on the SAN, never the CN)."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)]
    if common_name is not None:
        if not common_name or len(common_name) > MAX_CN:
            raise CertError(f"a commonName is 1..{MAX_CN} characters, not {len(common_name)}")
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def general_name(name: str, *, wildcard: bool = False) -> x509.GeneralName:
    """The subjectAltName entry for a host: iPAddress for an IP literal, else an A-label dNSName.

    "*.x" only with wildcard=True (the self-test's fake hosts): the daemon signs for the one name a
    client asked for, never a wildcard that would also cover that name's siblings.
    """
    if not isinstance(name, str) or not name:
        raise CertError(f"certificate names are non-empty strings, not {name!r}")
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    host, prefix = name.rstrip("."), ""
    if wildcard and host.startswith("*."):
        host, prefix = host[2:], "*."
    try:
        return x509.DNSName(prefix + idna.encode(host, uts46=True).decode("ascii"))
    except idna.IDNAError as e:
        raise CertError(f"not a host name: {name!r} ({e})") from None


def name_constraints(names: Sequence[str]) -> x509.NameConstraints:
    """Only `names`, each with its subdomains (RFC 5280 dNSName constraints), and no IP address: the
    threat is a CA that leaked or was misused signing for a bank or for a bare address."""
    if not names:
        raise CertError("a name-constrained CA needs at least one name to sign for")
    return x509.NameConstraints(permitted_subtrees=[x509.DNSName(n) for n in names], excluded_subtrees=NO_ADDRESSES)


def ca(key: CaKey, name: x509.Name, valid: Validity, *, only: Sequence[str] | None) -> Authority:
    """A self-signed CA for leaves only; `only` = the names it may sign for (None: unconstrained, for a
    CA whose key never leaves the process that made it and never reaches a sandbox)."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid.not_before)
        .not_valid_after(valid.not_after)
        .add_extension(CA_BASIC_CONSTRAINTS, critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
    )
    if only is not None:
        builder = builder.add_extension(name_constraints(only), critical=True)
    builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    return Authority(builder.sign(key, hashes.SHA256()), key)


def within(authority: Authority, wanted: Validity, now: datetime.datetime) -> Validity:
    """`wanted` clipped to the CA's own lifetime (no verifier accepts a leaf that outlives its CA)."""
    ca_cert = authority.cert
    not_after = min(wanted.not_after, ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise CertError(f"the CA has expired (valid until {ca_cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)")
    return Validity(max(wanted.not_before, ca_cert.not_valid_before_utc), not_after)


def leaf(
    authority: Authority,
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    alt_names: Sequence[x509.GeneralName],
    valid: Validity,
) -> x509.Certificate:
    """A server certificate for `alt_names` signed directly by `authority` (the chain is the leaf)."""
    if not alt_names:
        raise CertError("a certificate needs at least one name")
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid.not_before)
        .not_valid_after(valid.not_after)
        .add_extension(LEAF_BASIC_CONSTRAINTS, critical=True)
        .add_extension(LEAF_KEY_USAGE, critical=True)
        .add_extension(LEAF_EXTENDED_KEY_USAGE, critical=False)
        .add_extension(x509.SubjectAlternativeName(list(alt_names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(authority), critical=False)
        .sign(authority.key, hashes.SHA256())
    )


def _authority_key_id(authority: Authority) -> x509.AuthorityKeyIdentifier:
    """Names the CA's key the way the CA names itself, so a verifier picks the right issuer."""
    try:
        ski = authority.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def load(cert: str | bytes, key: str | bytes) -> Authority:
    """A CA pair from PEM (the daemon's, from the spec): refused unless the key matches and it is a CA."""
    try:
        ca_cert = x509.load_pem_x509_certificate(cert.encode() if isinstance(cert, str) else cert)
        ca_key = serialization.load_pem_private_key(key.encode() if isinstance(key, str) else key, password=None)
    except (ValueError, TypeError) as e:
        raise CertError(f"the CA is not a PEM certificate and unencrypted key: {e}") from None
    if not isinstance(ca_key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise CertError("the CA key must be EC or RSA")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if ca_cert.public_key().public_bytes(*spki) != ca_key.public_key().public_bytes(*spki):
        raise CertError("the CA key does not match its certificate")
    try:
        bc = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise CertError("the CA certificate is not a CA (basicConstraints ca=true missing)")
    return Authority(ca_cert, ca_key)

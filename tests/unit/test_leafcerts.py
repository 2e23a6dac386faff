"""Leaf certificates from the run's CA: names, usage, validity, signature, cache and refusals."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from netguard.decision.leafcerts import MAX_CACHED, Issuer, LeafError

from ..support.tlsharness import run_ca

NOW = datetime.datetime.now(datetime.UTC)


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def make_ca(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, *, ca: bool = True, days: int = 2) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_a_leaf_names_the_host_for_server_auth_within_the_ca_validity() -> None:
    pair = run_ca()
    issuer = Issuer(pair.cert, pair.key)
    leaf = issuer.leaf("Bücher.test")
    ca = x509.load_pem_x509_certificate(pair.cert.encode())
    leaf.cert.verify_directly_issued_by(ca)  # signed by the run's CA (raises otherwise)
    sans = leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["xn--bcher-kva.test"]
    eku = leaf.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not leaf.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.not_valid_before_utc <= leaf.cert.not_valid_before_utc <= NOW
    assert NOW < leaf.cert.not_valid_after_utc <= ca.not_valid_after_utc  # clipped: the CA lives 2 days
    assert isinstance(leaf.key, ec.EllipticCurvePrivateKey) and leaf.key.curve.name == "secp256r1"
    pub = leaf.cert.public_key()
    assert isinstance(pub, ec.EllipticCurvePublicKey) and pub.public_numbers() == leaf.key.public_key().public_numbers()


def test_an_ip_name_gets_an_ip_san() -> None:
    pair = run_ca()
    leaf = Issuer(pair.cert, pair.key).leaf("192.0.2.5")
    sans = leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("192.0.2.5")]


def test_leaves_are_cached_per_name_with_a_bound() -> None:
    pair = run_ca()
    issuer = Issuer(pair.cert, pair.key, max_cached=2)
    a = issuer.leaf("a.test")
    assert issuer.leaf("a.test") is a  # cached: not signed again
    assert issuer.leaf("b.test") is not a
    issuer.leaf("c.test")  # evicts the least recently used
    assert issuer.leaf("b.test") is issuer.leaf("b.test")
    assert issuer.leaf("a.test") is not a
    assert MAX_CACHED > 0
    other = Issuer(pair.cert, pair.key)  # another sandbox: its own cache
    assert other.leaf("b.test") is not issuer.leaf("b.test")


def test_a_leaf_near_its_end_is_renewed() -> None:
    pair = run_ca()
    issuer = Issuer(pair.cert, pair.key)
    a = issuer.leaf("a.test")
    later = a.cert.not_valid_after_utc - datetime.timedelta(hours=1)
    with pytest.raises(LeafError, match="expired"):
        issuer.leaf("a.test", now=later + datetime.timedelta(days=5))  # past the CA's end: refused
    assert issuer.leaf("a.test", now=later - datetime.timedelta(hours=30)) is a  # more than a day left
    renewed = issuer.leaf("a.test", now=later)  # less than a day left: signed anew
    assert renewed is not a and renewed.cert.serial_number != a.cert.serial_number


def test_an_rsa_ca_is_accepted() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    issuer = Issuer(make_ca(key), pem(key))
    issuer.leaf("a.test").cert.verify_directly_issued_by(issuer.ca)


def test_unusable_ca_pairs_are_refused() -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(LeafError, match="not a CA"):
        Issuer(make_ca(key, ca=False), pem(key))
    with pytest.raises(LeafError, match="does not match"):
        Issuer(make_ca(key), pem(other))
    with pytest.raises(LeafError, match="not a PEM"):
        Issuer("junk", pem(key))
    with pytest.raises(LeafError, match="not a host name"):
        Issuer(make_ca(key), pem(key)).leaf("bad..name")

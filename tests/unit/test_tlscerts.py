"""netguard/tlscerts.py: every extension exactly as defined, and what two real verifiers make of the
certificates (cryptography's webpki-style verifier, and OpenSSL through the ssl module, strict)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from netguard import tlscerts

from .test_certs import handshake

NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)
ROOT = Path(__file__).resolve().parents[2]


def _ca(only: tuple[str, ...] | None = ("inspect.test", "github.com")) -> tlscerts.Authority:
    valid = tlscerts.Validity(NOW - HOUR, NOW + 30 * DAY)
    return tlscerts.ca(tlscerts.new_key(), tlscerts.subject("sandgate", "test CA"), valid, only=only)


def _leaf(ca: tlscerts.Authority, *names: str, key: ec.EllipticCurvePrivateKey | None = None) -> x509.Certificate:
    alt = [tlscerts.general_name(n, wildcard=True) for n in names]
    valid = tlscerts.within(ca, tlscerts.Validity(NOW - HOUR, NOW + 7 * DAY), NOW)
    return tlscerts.leaf(ca, key or tlscerts.new_key(), tlscerts.subject("sandgate inspection"), alt, valid)


def _verify(ca: tlscerts.Authority, leaf: x509.Certificate, name: x509.GeneralName, *chain: x509.Certificate) -> str:
    """'ok' or the refusal of cryptography's verifier for `leaf` as a server named `name`."""
    store = verification.Store([ca.cert])
    builder = verification.PolicyBuilder().store(store).time(NOW)
    assert isinstance(name, (x509.DNSName, x509.IPAddress))
    try:
        builder.build_server_verifier(name).verify(leaf, list(chain))
    except verification.VerificationError as e:
        return str(e)
    return "ok"


def _ext[E: x509.ExtensionType](cert: x509.Certificate, cls: type[E]) -> x509.Extension[E]:
    return cert.extensions.get_extension_for_class(cls)


def test_the_ca_profile_is_exactly_a_leaf_signer_for_its_names() -> None:
    key = tlscerts.new_key()
    valid = tlscerts.Validity(NOW - HOUR, NOW + 30 * DAY)
    ca = tlscerts.ca(key, tlscerts.subject("sandgate", "run CA"), valid, only=("inspect.test", "github.com"))
    cert = ca.cert
    assert ca.key is key and cert.public_key() == key.public_key()
    assert cert.version == x509.Version.v3 and isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    cert.verify_directly_issued_by(cert)  # self-signed
    assert (
        cert.issuer
        == cert.subject
        == x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandgate"),
                x509.NameAttribute(NameOID.COMMON_NAME, "run CA"),
            ]
        )
    )
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (valid.not_before, valid.not_after)
    assert [e.oid for e in cert.extensions] == [
        ExtensionOID.BASIC_CONSTRAINTS,
        ExtensionOID.KEY_USAGE,
        ExtensionOID.NAME_CONSTRAINTS,
        ExtensionOID.SUBJECT_KEY_IDENTIFIER,
    ]
    bc = _ext(cert, x509.BasicConstraints)
    assert bc.critical and bc.value == x509.BasicConstraints(ca=True, path_length=0)
    ku = _ext(cert, x509.KeyUsage)
    assert ku.critical and ku.value == tlscerts.CA_KEY_USAGE
    assert ku.value.key_cert_sign and ku.value.crl_sign and not ku.value.digital_signature
    assert not (ku.value.key_encipherment or ku.value.key_agreement or ku.value.content_commitment)
    nc = _ext(cert, x509.NameConstraints)
    assert nc.critical
    assert nc.value.permitted_subtrees == [x509.DNSName("inspect.test"), x509.DNSName("github.com")]
    assert nc.value.excluded_subtrees == [
        x509.IPAddress(ipaddress.ip_network("0.0.0.0/0")),
        x509.IPAddress(ipaddress.ip_network("::/0")),
    ]
    ski = _ext(cert, x509.SubjectKeyIdentifier)
    assert not ski.critical and ski.value == x509.SubjectKeyIdentifier.from_public_key(key.public_key())


def test_an_unconstrained_ca_differs_only_by_its_missing_name_constraints() -> None:
    cert = _ca(only=None).cert
    assert [e.oid for e in cert.extensions] == [
        ExtensionOID.BASIC_CONSTRAINTS,
        ExtensionOID.KEY_USAGE,
        ExtensionOID.SUBJECT_KEY_IDENTIFIER,
    ]
    assert _ext(cert, x509.BasicConstraints).value.path_length == 0
    assert _ext(cert, x509.KeyUsage).value == tlscerts.CA_KEY_USAGE
    with pytest.raises(tlscerts.CertError, match="at least one name"):
        _ca(only=())


def test_the_leaf_profile_is_exactly_a_server_certificate() -> None:
    ca = _ca()
    key = tlscerts.new_key()
    leaf = _leaf(ca, "a.inspect.test", "192.0.2.7", key=key)
    assert leaf.public_key() == key.public_key() and leaf.issuer == ca.cert.subject
    assert leaf.version == x509.Version.v3 and isinstance(leaf.signature_hash_algorithm, hashes.SHA256)
    leaf.verify_directly_issued_by(ca.cert)
    assert leaf.subject == x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandgate inspection")])
    assert [e.oid for e in leaf.extensions] == [
        ExtensionOID.BASIC_CONSTRAINTS,
        ExtensionOID.KEY_USAGE,
        ExtensionOID.EXTENDED_KEY_USAGE,
        ExtensionOID.SUBJECT_ALTERNATIVE_NAME,
        ExtensionOID.SUBJECT_KEY_IDENTIFIER,
        ExtensionOID.AUTHORITY_KEY_IDENTIFIER,
    ]
    bc = _ext(leaf, x509.BasicConstraints)
    assert bc.critical and bc.value == x509.BasicConstraints(ca=False, path_length=None)
    ku = _ext(leaf, x509.KeyUsage)
    assert ku.critical and ku.value == tlscerts.LEAF_KEY_USAGE
    assert ku.value.digital_signature and not (ku.value.key_cert_sign or ku.value.crl_sign)
    eku = _ext(leaf, x509.ExtendedKeyUsage)
    assert not eku.critical and list(eku.value) == [ExtendedKeyUsageOID.SERVER_AUTH]  # serverAuth only
    san = _ext(leaf, x509.SubjectAlternativeName)
    assert not san.critical
    assert list(san.value) == [x509.DNSName("a.inspect.test"), x509.IPAddress(ipaddress.ip_address("192.0.2.7"))]
    assert _ext(leaf, x509.SubjectKeyIdentifier).value == x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    aki = _ext(leaf, x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == _ext(ca.cert, x509.SubjectKeyIdentifier).value.key_identifier
    assert (leaf.not_valid_before_utc, leaf.not_valid_after_utc) == (NOW - HOUR, NOW + 7 * DAY)
    with pytest.raises(tlscerts.CertError, match="at least one name"):
        _leaf(ca)


def test_a_leaf_under_a_ca_without_ski_names_the_ca_key() -> None:
    key = tlscerts.new_key()
    name = tlscerts.subject("other")
    bare = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    leaf = _leaf(tlscerts.Authority(bare, key), "a.test")
    aki = _ext(leaf, x509.AuthorityKeyIdentifier).value
    assert aki == x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())


def test_leaves_inside_the_name_constraints_verify() -> None:
    ca = _ca()
    for name in ("inspect.test", "a.inspect.test", "github.com", "api.github.com"):
        assert _verify(ca, _leaf(ca, name), x509.DNSName(name)) == "ok", name


@pytest.mark.parametrize(
    "name", ["bank.test", "github.com.evil.test", "evilgithub.com", "inspect.test.bank.test", "192.0.2.1", "::1"]
)
def test_a_leaf_outside_the_name_constraints_is_refused_by_both_verifiers(name: str, tmp_path: Path) -> None:
    ca = _ca()
    key = tlscerts.new_key()
    leaf = _leaf(ca, name, key=key)
    alt = tlscerts.general_name(name)
    assert "name constraint" in _verify(ca, leaf, alt)
    # The same leaf, signed by the same CA but unconstrained, passes: the constraint is what refuses.
    free = _ca(only=None)
    assert _verify(free, _leaf(free, name), alt) == "ok"
    files = _files(tmp_path, ca, leaf, key)
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree violation"):
        handshake(files[:2], files[2], name)


def _files(
    tmp: Path, ca: tlscerts.Authority, leaf: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path, Path]:
    """(chain, key, ca) PEM files for the ssl module."""
    chain, key_file, ca_file = tmp / "chain.pem", tmp / "key.pem", tmp / "ca.pem"
    chain.write_bytes(tlscerts.cert_pem(leaf))
    key_file.write_bytes(tlscerts.key_pem(key))
    ca_file.write_bytes(tlscerts.cert_pem(ca.cert))
    return chain, key_file, ca_file


def test_openssl_strict_accepts_an_inspection_leaf_and_refuses_a_wrong_name(tmp_path: Path) -> None:
    ca = _ca()
    key = tlscerts.new_key()
    chain, key_file, ca_file = _files(tmp_path, ca, _leaf(ca, "a.inspect.test", key=key), key)
    assert handshake((chain, key_file), ca_file, "a.inspect.test") == "TLSv1.3"
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake((chain, key_file), ca_file, "b.inspect.test")


def test_path_length_zero_refuses_an_intermediate_the_ca_signed() -> None:
    """The threat: a leaked CA key mints an intermediate, and that one signs for anything."""
    ca = _ca(only=None)
    mid_key = tlscerts.new_key()
    mid_name = tlscerts.subject("attacker", "intermediate")
    mid = (
        x509.CertificateBuilder()
        .subject_name(mid_name)
        .issuer_name(ca.cert.subject)
        .public_key(mid_key.public_key())
        .serial_number(2)
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(tlscerts.CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(mid_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    under_mid = _leaf(tlscerts.Authority(mid, mid_key), "bank.test")
    assert "path length constraint" in _verify(ca, under_mid, x509.DNSName("bank.test"), mid)
    assert _verify(ca, _leaf(ca, "bank.test"), x509.DNSName("bank.test")) == "ok"  # directly: fine


def test_a_leaf_key_cannot_sign_a_certificate_a_verifier_accepts() -> None:
    """The threat: a leaf key read from the daemon's memory used as a CA."""
    ca = _ca(only=None)
    leaf_key = tlscerts.new_key()
    leaf = _leaf(ca, "a.test", key=leaf_key)
    forged = _leaf(tlscerts.Authority(leaf, leaf_key), "bank.test")
    assert "cA must be asserted" in _verify(ca, forged, x509.DNSName("bank.test"), leaf)
    assert _verify(ca, leaf, x509.DNSName("a.test")) == "ok"


def test_the_leaf_is_for_servers_only() -> None:
    """The threat: an inspection leaf presented as a TLS client certificate somewhere."""
    ca = _ca(only=None)
    leaf = _leaf(ca, "a.test")
    store = verification.Store([ca.cert])
    client = verification.PolicyBuilder().store(store).time(NOW).build_client_verifier()
    with pytest.raises(verification.VerificationError, match="required EKU not found"):
        client.verify(leaf, [])
    assert _verify(ca, leaf, x509.DNSName("a.test")) == "ok"  # the same leaf as a server: fine


@pytest.mark.parametrize(
    ("name", "san"),
    [
        ("a.test", x509.DNSName("a.test")),
        ("a.test.", x509.DNSName("a.test")),
        ("Bücher.test", x509.DNSName("xn--bcher-kva.test")),
        ("192.0.2.5", x509.IPAddress(ipaddress.ip_address("192.0.2.5"))),
        ("2001:db8::1", x509.IPAddress(ipaddress.ip_address("2001:db8::1"))),
    ],
)
def test_general_names(name: str, san: x509.GeneralName) -> None:
    assert tlscerts.general_name(name) == san
    assert tlscerts.general_name(name, wildcard=True) == san


def test_wildcards_only_when_asked_and_no_junk() -> None:
    assert tlscerts.general_name("*.wild.test", wildcard=True) == x509.DNSName("*.wild.test")
    assert tlscerts.general_name("*.bücher.test", wildcard=True) == x509.DNSName("*.xn--bcher-kva.test")
    for bad in ("*.wild.test", "", "bad..name", "a b.test", "-a.test"):
        with pytest.raises(tlscerts.CertError):
            tlscerts.general_name(bad)
    with pytest.raises(tlscerts.CertError):
        tlscerts.general_name(None)  # type: ignore[arg-type]


def test_validity_is_clipped_to_the_ca_and_an_expired_ca_signs_nothing() -> None:
    ca = tlscerts.ca(tlscerts.new_key(), tlscerts.subject("s"), tlscerts.Validity(NOW - HOUR, NOW + DAY), only=None)
    got = tlscerts.within(ca, tlscerts.Validity(NOW - DAY, NOW + 7 * DAY), NOW)
    assert got == tlscerts.Validity(NOW - HOUR, NOW + DAY)
    inside = tlscerts.Validity(NOW - 1 * datetime.timedelta(minutes=5), NOW + HOUR)
    assert tlscerts.within(ca, inside, NOW) == inside
    with pytest.raises(tlscerts.CertError, match="expired"):
        tlscerts.within(ca, tlscerts.Validity(NOW, NOW + 7 * DAY), NOW + 2 * DAY)
    with pytest.raises(tlscerts.CertError, match="end after it starts"):
        tlscerts.Validity(NOW, NOW)


def test_subject_names() -> None:
    assert tlscerts.subject("o") == x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o")])
    assert tlscerts.subject("o", "c" * 64).get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "c" * 64
    for bad in ("", "c" * 65):
        with pytest.raises(tlscerts.CertError, match="commonName"):
            tlscerts.subject("o", bad)


def test_pem_round_trip_and_load() -> None:
    ca = _ca()
    pem_cert, pem_key = tlscerts.cert_pem(ca.cert), tlscerts.key_pem(ca.key)
    assert pem_cert.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE" not in pem_cert
    assert pem_key.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    for loaded in (tlscerts.load(pem_cert, pem_key), tlscerts.load(pem_cert.decode(), pem_key.decode())):
        assert loaded.cert == ca.cert
        assert isinstance(loaded.key, ec.EllipticCurvePrivateKey)
        assert loaded.key.private_numbers() == ca.key.private_numbers()


def _self_signed(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey, *, ca: bool | None) -> bytes:
    name = tlscerts.subject("t")
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(3)
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + DAY)
    )
    if ca is not None:
        b = b.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return b.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)


def _pkcs8(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_load_refuses_what_cannot_sign() -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_ca = tlscerts.load(_self_signed(rsa_key, ca=True), _pkcs8(rsa_key))
    _leaf(rsa_ca, "a.test").verify_directly_issued_by(rsa_ca.cert)  # an RSA CA signs
    ca = _ca()
    cases = [
        ((b"junk", tlscerts.key_pem(ca.key)), "not a PEM"),
        ((tlscerts.cert_pem(ca.cert), b"junk"), "not a PEM"),
        ((tlscerts.cert_pem(ca.cert), tlscerts.key_pem(tlscerts.new_key())), "does not match"),
        ((_self_signed(rsa_key, ca=False), _pkcs8(rsa_key)), "not a CA"),
        ((_self_signed(rsa_key, ca=None), _pkcs8(rsa_key)), "not a CA"),
    ]
    ed = ed25519.Ed25519PrivateKey.generate()
    cases.append(((_self_signed(ed, ca=True), _pkcs8(ed)), "EC or RSA"))
    for (cert, key), message in cases:
        with pytest.raises(tlscerts.CertError, match=message):
            tlscerts.load(cert, key)


def test_certificates_are_built_nowhere_else() -> None:
    """One definition of what a certificate may do: no product module builds one or names an extension."""
    here = ROOT / "netguard" / "tlscerts.py"
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"] + [ROOT / "bench"]
    assert {"launcher", "netguard", "fsguard"} <= {p.name for p in packages}
    found = []
    for path in (f for pkg in packages for f in pkg.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for needle in (
            "CertificateBuilder",
            "KeyUsage(",
            "BasicConstraints(",
            "NameConstraints(",
            "generate_private_key",
        ):
            if path != here and needle in text:
                found.append(f"{path.relative_to(ROOT)}: {needle}")
    assert found == []

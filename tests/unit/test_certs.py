"""selftest/certs.py: throwaway CA and leaves, verified by the ssl module (in memory, no sockets)."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from netguard import tlscerts
from selftest.certs import CA, Leaf


def handshake(leaf_files: tuple[Path, Path], cafile: Path, server_hostname: str) -> str:
    """A full TLS handshake between two ssl objects over memory BIOs; returns the TLS version."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*map(str, leaf_files))
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    bios = [ssl.MemoryBIO() for _ in range(4)]  # c_in, c_out, s_in, s_out
    client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname=server_hostname)
    server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for key, obj in (("c", client), ("s", server)):
            if not done[key]:
                try:
                    obj.do_handshake()
                    done[key] = True
                except ssl.SSLWantReadError:
                    pass
        bios[2].write(bios[1].read())
        bios[0].write(bios[3].read())
        if all(done.values()):
            return str(client.version())
    raise AssertionError("handshake did not finish")


@pytest.fixture(scope="module")
def ca() -> CA:
    return CA()


@pytest.fixture
def ca_pem(ca: CA, tmp_path: Path) -> Path:
    return ca.write_cert(tmp_path / "ca.pem")


@pytest.mark.parametrize(
    ("names", "hostname"),
    [
        (("a.test",), "a.test"),
        (("a.test", "198.51.100.10"), "198.51.100.10"),
        (("*.wild.test",), "sub.wild.test"),
        (("bücher.test",), "xn--bcher-kva.test"),
        (("::1",), "::1"),
    ],
)
def test_leaf_verifies_against_its_ca(
    ca: CA, ca_pem: Path, tmp_path: Path, names: tuple[str, ...], hostname: str
) -> None:
    files = ca.issue(*names).write(tmp_path / "chain.pem", tmp_path / "key.pem")
    assert handshake(files, ca_pem, hostname) == "TLSv1.3"


def test_wrong_name_and_other_ca_are_refused(ca: CA, ca_pem: Path, tmp_path: Path) -> None:
    files = ca.issue("a.test", "*.wild.test").write(tmp_path / "chain.pem", tmp_path / "key.pem")
    for hostname in ("b.test", "wild.test", "a.b.wild.test"):
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            handshake(files, ca_pem, hostname)
    other = CA().write_cert(tmp_path / "other.pem")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(files, other, "a.test")


def test_files_and_constraints(ca: CA, ca_pem: Path, tmp_path: Path) -> None:
    leaf = ca.issue("a.test")
    assert isinstance(leaf, Leaf) and leaf.names == ("a.test",)
    chain, key = leaf.write(tmp_path / "chain.pem", tmp_path / "key.pem")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(chain.stat().st_mode) == 0o644
    assert b"PRIVATE KEY" in key.read_bytes() and b"PRIVATE KEY" not in chain.read_bytes()
    assert b"PRIVATE KEY" not in ca_pem.read_bytes(), "the CA key never leaves memory"
    root = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    bc = root.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0  # cannot mint intermediates
    cert = x509.load_pem_x509_certificate(chain.read_bytes())
    assert cert.issuer == root.subject and not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.not_valid_after_utc <= root.not_valid_after_utc
    # The one profile (netguard/tlscerts.py): the same as the inspection CA's and leaves'.
    assert root.extensions.get_extension_for_class(x509.KeyUsage).value == tlscerts.CA_KEY_USAGE
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == tlscerts.LEAF_EXTENDED_KEY_USAGE
    with pytest.raises(x509.ExtensionNotFound):
        root.extensions.get_extension_for_class(x509.NameConstraints)  # fake names and IP literals alike
    with pytest.raises(ValueError, match="at least one name"):
        ca.issue()
    assert CA().subject != ca.subject  # concurrent worlds' CAs are told apart

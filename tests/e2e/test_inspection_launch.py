"""Issue 13, the launcher's side of inspection: the run's CA, the bundle the sandbox trusts, the
variables that name it, --upstream-ca, and that a run without inspection never loads cryptography."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification

from launcher.config.checks import Checks
from launcher.config.load import build_policy
from launcher.errors import RunError
from launcher.run import inspection
from netguard.decision.leafcerts import Issuer
from netguard.policy import NetworkPolicy
from netguard.spec import CaPair

from ..support.caoracle import CA_VARIABLES

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
POLICY = """version: 1
network:
  allow:
    - host: github.com
      http: [read-only]
    - host: "*.inspect.test"
      inspect: true
    - host: plain.test
    - host: api.example.test
  credentials:
    - host: api.example.test
      value: "Bearer ${EXAMPLE_KEY}"
"""


def _policy(tmp_path: Path, text: str = POLICY) -> NetworkPolicy:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return build_policy([p], [], [], checks=Checks()).network


def _leaf(ca: CaPair, name: str) -> x509.Certificate:
    """A leaf for `name` signed by the CA, as the daemon issues it."""
    return Issuer(ca.cert, ca.key).leaf(name, now=NOW).cert


def _verifies(ca: CaPair, name: str) -> bool:
    store = verification.Store([x509.load_pem_x509_certificate(ca.cert.encode())])
    verifier = verification.PolicyBuilder().store(store).time(NOW).build_server_verifier(x509.DNSName(name))
    try:
        verifier.verify(_leaf(ca, name), [])
    except verification.VerificationError:
        return False
    return True


def test_inspected_names_are_the_inspecting_hosts_wildcard_suffixes_and_credential_hosts(tmp_path: Path) -> None:
    net = _policy(tmp_path)
    assert inspection.needed(net)
    assert inspection.inspected_names(net) == ("github.com", "inspect.test", "api.example.test")
    assert not inspection.needed(_policy(tmp_path, "version: 1\nnetwork:\n  allow: [plain.test]\n"))


def test_the_ca_is_a_p256_ca_for_leaves_only_valid_thirty_days(tmp_path: Path) -> None:
    ca = inspection.new_ca("task42", ("github.com", "inspect.test"), now=NOW)
    cert = x509.load_pem_x509_certificate(ca.cert.encode())
    key = serialization.load_pem_private_key(ca.key.encode(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign and not ku.value.digital_signature
    subject = cert.subject.rfc4514_string()
    assert "sandgate" in subject and "task42" in subject and cert.issuer == cert.subject
    assert cert.not_valid_before_utc < NOW < cert.not_valid_after_utc
    assert NOW - cert.not_valid_before_utc <= datetime.timedelta(minutes=10)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=30)
    assert "PRIVATE KEY" not in ca.cert and "BEGIN PRIVATE KEY" in ca.key


def test_name_constraints_permit_only_the_inspected_names(tmp_path: Path) -> None:
    ca = inspection.new_ca("t", ("github.com", "inspect.test"), now=NOW)
    nc = x509.load_pem_x509_certificate(ca.cert.encode()).extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical
    assert [n.value for n in nc.value.permitted_subtrees or []] == ["github.com", "inspect.test"]
    assert {str(n.value) for n in nc.value.excluded_subtrees or []} == {"0.0.0.0/0", "::/0"}
    # What a verifier makes of it: leaves for the inspected names pass, any other is refused.
    assert _verifies(ca, "github.com") and _verifies(ca, "a.inspect.test")
    assert not _verifies(ca, "bank.test") and not _verifies(ca, "github.com.evil.test")


def test_a_ca_needs_names_and_each_run_gets_its_own() -> None:
    with pytest.raises(RunError):
        inspection.new_ca("t", ())
    a, b = inspection.new_ca("t", ("a.test",)), inspection.new_ca("t", ("a.test",))
    assert a.key != b.key and a.cert != b.cert


def _pem(text: str) -> str:
    return f"-----BEGIN CERTIFICATE-----\n{text}\n-----END CERTIFICATE-----\n"


def test_the_bundle_holds_the_system_roots_the_ca_and_the_callers_bundles(tmp_path: Path) -> None:
    system = tmp_path / "system.pem"
    system.write_text(_pem("U1lTVEVN"))
    corp = tmp_path / "corp.pem"
    corp.write_text(_pem("Q09SUA=="))
    junk = tmp_path / "junk.txt"
    junk.write_text("not a bundle")
    combined = tmp_path / "combined.pem"  # a certificate and its key in one file: only the certificate goes in
    combined.write_text(_pem("Q09NQg==") + "-----BEGIN PRIVATE KEY-----\nS0VZ\n-----END PRIVATE KEY-----\n")
    env = {
        "SSL_CERT_FILE": str(corp),
        "REQUESTS_CA_BUNDLE": str(corp),  # the same file twice: once in the bundle
        "NODE_EXTRA_CA_CERTS": str(junk),  # no certificate: adds nothing
        "CURL_CA_BUNDLE": str(tmp_path / "missing.pem"),
        "AWS_CA_BUNDLE": str(combined),
    }
    ca = inspection.new_ca("t", ("a.test",))
    out = inspection.compose_bundle(ca.cert, env, [str(system)])
    assert out.count("U1lTVEVN") == 1 and out.count("Q09SUA==") == 1 and ca.cert in out
    assert "not a bundle" not in out and "PRIVATE" not in out and "S0VZ" not in out and "Q09NQg==" in out
    assert out.index("U1lTVEVN") < out.index("Q09SUA==") < out.index(ca.cert)


def test_install_writes_the_bundle_and_names_it_through_every_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "real.crt"
    target.write_text(_pem("SE9TVA=="))
    link = tmp_path / "ca-certificates.crt"
    link.symlink_to(target)
    monkeypatch.setattr(inspection, "SYSTEM_BUNDLES", (str(tmp_path / "absent.pem"), str(link)))
    ca = inspection.new_ca("t", ("a.test",))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    t = inspection.install(run, ca.cert, {})
    assert t.bundle == run / inspection.BUNDLE_NAME and (t.bundle.stat().st_mode & 0o777) == 0o644
    text = t.bundle.read_text()
    assert "SE9TVA==" in text and ca.cert in text and ca.key not in text and "PRIVATE" not in text
    assert t.binds == ((str(target), t.bundle),)  # onto the real file the inside opens, not the link
    assert set(t.env) == CA_VARIABLES and set(t.env.values()) == {str(link)}
    assert not any(ca.key in f.read_text() for f in run.iterdir())  # the key is never on disk


def test_install_without_any_system_bundle_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspection, "SYSTEM_BUNDLES", (str(tmp_path / "none.pem"),))
    with pytest.raises(RunError, match="ca-certificates"):
        inspection.install(tmp_path, "x", {})


def test_upstream_ca_must_be_pem_certificates(tmp_path: Path) -> None:
    ca = inspection.new_ca("t", ("a.test",))
    good = tmp_path / "roots.pem"
    good.write_text("# a comment\n" + ca.cert)
    assert x509.load_pem_x509_certificate(inspection.read_upstream_ca(str(good)).encode()) == (  # type: ignore[union-attr]
        x509.load_pem_x509_certificate(ca.cert.encode())
    )
    assert inspection.read_upstream_ca(None) is None
    bad = tmp_path / "bad.pem"
    bad.write_text("hello\n")
    garbled = tmp_path / "garbled.pem"
    garbled.write_text(_pem("!!!notbase64"))
    with pytest.raises(RunError, match=r"--upstream-ca .*bad.pem: not a PEM file"):
        inspection.read_upstream_ca(str(bad))
    with pytest.raises(RunError, match="not a PEM file"):
        inspection.read_upstream_ca(str(garbled))
    with pytest.raises(RunError, match="No such file"):
        inspection.read_upstream_ca(str(tmp_path / "missing.pem"))


def test_upstream_ca_errors_are_one_line_from_the_cli(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("hello\n")
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "run", "--allow", "a.test", "--upstream-ca", str(bad), "--", "true"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=60,
    )
    assert r.returncode == 125, r
    assert r.stderr.strip().splitlines() == [
        f"sandgate: error: --upstream-ca {bad}: not a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)"
    ]


def test_a_run_without_inspection_never_imports_cryptography(tmp_path: Path) -> None:
    """The launch path of a plain policy: the CA step is reached and skipped without loading cryptography;
    the same step with an inspecting policy loads it (so this test can fail)."""
    code = """
import json, sys
from pathlib import Path
from launcher.run import launch, options
from launcher.config.load import build_policy
from launcher.config.checks import Checks
pol = build_policy([Path(sys.argv[1])], [], [], checks=Checks())
opts = options.RunOptions(cmd=["true"], audit_path=Path("/dev/null"), user=None, policy=pol)
tls = launch._terminating(opts)
print(json.dumps([tls is not None, "cryptography" in sys.modules or "launcher.run.inspection" in sys.modules]))
"""
    plain = tmp_path / "plain.yaml"
    plain.write_text("version: 1\nnetwork:\n  allow: [plain.test]\n")
    inspecting = tmp_path / "inspecting.yaml"
    inspecting.write_text("version: 1\nnetwork:\n  allow:\n    - host: a.test\n      inspect: true\n")
    root = str(Path(__file__).resolve().parents[2])
    seen = []
    for p in (plain, inspecting):
        out = subprocess.run(
            [sys.executable, "-c", code, str(p)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": root},
        ).stdout
        seen.append(json.loads(out))
    assert seen == [[False, False], [True, True]]


def test_the_spec_carries_the_ca_the_upstream_roots_and_the_secrets(tmp_path: Path) -> None:
    """What launch hands the daemon survives the control protocol's encode/decode (a spec refuses to be
    made inspecting without a CA: fail closed)."""
    from launcher.run import brokered, linuxbackend, options, runstate
    from netguard import spec

    p = tmp_path / "policy.yaml"
    p.write_text(POLICY)
    pol = build_policy([p], [], [], checks=Checks())
    roots = inspection.new_ca("upstream", ("a.test",)).cert
    opts = options.RunOptions(cmd=["true"], audit_path=Path("/dev/null"), user=None, policy=pol, upstream_ca=roots)
    creds = brokered.resolve(pol.network.credentials, {"EXAMPLE_KEY": "sk-real-0123456789abcdefghij"})
    tls = linuxbackend.Terminating(inspection.new_ca(opts.task, inspection.inspected_names(pol.network)), creds)
    got = spec.decode(spec.encode(linuxbackend._spec(opts, runstate.RunPaths(tmp_path, "x"), None, tls)))
    assert got.ca == tls.ca and got.upstream_ca == roots and got.secrets == creds.secrets
    with pytest.raises(spec.SpecError, match="ca is needed"):  # refused where it is made, before any daemon
        linuxbackend._spec(opts, runstate.RunPaths(tmp_path, "x"), None, None)

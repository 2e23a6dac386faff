"""Issue 13, end to end on the launcher's side: a real `sandgate run` with an inspecting policy and
brokered credentials. From inside: every CA variable names a readable bundle holding this run's CA
(and the caller's corporate root), the system bundle path shows it too, Python's default SSL
context trusts it; the credential variables hold sentinels; the real secrets and the CA's private
key are nowhere a process inside can read (/proc/*/environ and cmdline, /run, /tmp, the home, the
run directory), and the credential file is hidden. A plain run does not even import cryptography.

The request-level tests (the daemon actually terminating TLS) are tests/e2e/ of the daemon side.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from launcher.run import trustpaths
from netguard.audit import read_records
from selftest.certs import CA

from ..support.runner import REPO, SANDGATE, VIEW, Sandgate, env
from ..support.world import World, new_world

REAL = "sk-REALSECRET-" + "7f3a" * 8  # a value the env filter would drop anyway: the broker must still not leak it
FILE_SECRET = "npm_FILESECRET" + "b2c4" * 8
POLICY = """version: 1
network:
  allow:
    - host: api.example.test
    - host: "*.inspect.test"
      inspect: true
    - host: plain.test
  credentials:
    - host: api.example.test
      value: "Bearer ${{EXAMPLE_API_KEY}}"
    - host: api.example.test
      header: X-Registry-Token
      value: "${{REGISTRY_TOKEN}}"
      file: {token}
"""
#: Runs inside the sandbox: reports what it sees as one JSON document.
PROBE = r"""
import json, os, ssl, sys
names = sys.argv[1].split(",")
scan_roots = sys.argv[2].split(",")
needles = [n for n in sys.stdin.read().split(",") if n]  # not in argv: /proc/*/cmdline would show them
out = {"vars": {}, "hits": [], "scanned": 0}
for v in names:
    p = os.environ.get(v)
    try:
        out["vars"][v] = [p, open(p).read()]
    except (OSError, TypeError) as e:
        out["vars"][v] = [p, None]
out["system"] = open("/etc/ssl/certs/ca-certificates.crt").read()
out["sentinels"] = {k: os.environ.get(k) for k in ("EXAMPLE_API_KEY", "REGISTRY_TOKEN", "LABEL_COPY")}
def check(path, data):
    out["scanned"] += 1
    for n in needles:
        if n.encode() in data:
            out["hits"].append([path, n[:12]])
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for what in ("environ", "cmdline"):
            try:
                check(f"/proc/{pid}/{what}", open(f"/proc/{pid}/{what}", "rb").read())
            except OSError:
                pass
skip = set(sys.argv[4].split(",")) if len(sys.argv) > 4 else set()  # the tests' own checkout (see _SKIP)
for root in scan_roots:
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if os.path.join(d, x) not in skip]
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) > 8 << 20:
                    continue
                check(p, open(p, "rb").read())
            except OSError:
                pass
try:
    out["token_file"] = open(sys.argv[3]).read()
except OSError as e:
    out["token_file"] = f"error: {e.strerror}"
print(json.dumps(out))
"""
#: A checkout under /tmp is made visible inside (runner.VIEW) and its own sources and tests name
#: "PRIVATE KEY": the scan looks for leaks of the run, never into the code that runs the test.
_SKIP = str(REPO)
SSL_PROBE = (
    "import json, ssl; ctx = ssl.create_default_context(); "
    "print(json.dumps([dict(x[0] for x in c['subject']) for c in ctx.get_ca_certs()]))"
)


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[World, Path]]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root", pytrace=False)
    d = Path(tempfile.mkdtemp(prefix="sandgate-trust-", dir="/var/tmp"))
    try:
        with new_world() as w:
            for sub in ("ws", "home"):
                (d / sub).mkdir()
            yield w, d
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(d))
        shutil.rmtree(d, ignore_errors=True)


def _run(
    w: World, d: Path, cmd: list[str], extra_env: dict[str, str], name: str, stdin: str | None = None
) -> tuple[Any, Path]:
    token = d / "registry-token"
    token.write_text(FILE_SECRET + "\n")
    token.chmod(0o600)
    policy = d / f"{name}.yaml"
    policy.write_text(POLICY.format(token=token))
    audit = d / f"{name}.jsonl"
    sg = Sandgate(w, policy=policy, audit=audit, cwd=d / "ws", timeout=90, quiet=True)
    r = sg.run(cmd=cmd, env={**env(), "HOME": str(d / "home"), **extra_env}, input=stdin)
    return r, audit


def _task(audit: Path) -> str:
    return str(next(r for r in read_records(audit) if r["event"] == "policy")["task"])


def _ca_of(bundle: str) -> x509.Certificate:
    """The run's CA: the certificate after sandgate's marker in the bundle."""
    marker = "# sandgate: this run's inspection CA\n"
    assert bundle.count(marker) == 1, "the bundle holds no (or more than one) sandgate CA"
    return x509.load_pem_x509_certificate(bundle.split(marker, 1)[1].encode())


def test_the_sandbox_trusts_the_runs_ca_and_never_sees_a_secret_or_the_key(base: tuple[World, Path]) -> None:
    w, d = base
    corp = CA("Corp Root for sandgate test")
    (d / "corp.pem").write_bytes(corp.cert_pem)
    probe = d / "ws" / "probe.py"
    probe.write_text(PROBE)
    roots = ",".join(["/run", "/tmp", str(d / "home"), "/run/sandgate", str(d / "ws"), "/etc/ssl"])
    control = "SCAN-CONTROL-9d1e"  # planted in the home: proves the scan reads what it walks
    (d / "home" / "control.txt").write_text(control)
    needles = ",".join([REAL, FILE_SECRET, "PRIVATE KEY", control])
    caller = {
        "EXAMPLE_API_KEY": REAL,
        "LABEL_COPY": f"build-{REAL}-x",  # an innocent name carrying the real value: dropped
        "SSL_CERT_FILE": str(d / "corp.pem"),  # a corporate root the caller already trusted
    }
    cmd = ["python3", str(probe), ",".join(trustpaths.BUNDLE_VARIABLES), roots, str(d / "registry-token"), _SKIP]
    r, audit = _run(w, d, cmd, caller, "trust", stdin=needles)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    task = _task(audit)
    # Every variable names the system path, whose content (the bind) is the combined bundle.
    system = seen["system"]
    ca = _ca_of(system)
    assert task in ca.subject.rfc4514_string() and "sandgate" in ca.subject.rfc4514_string()
    assert corp.cert_pem.decode() in system  # the caller's corporate root kept working
    assert "BEGIN CERTIFICATE" in system.split("# sandgate:")[0]  # and the host's roots before it
    for var, (path, text) in seen["vars"].items():
        assert path == "/etc/ssl/certs/ca-certificates.crt" and text == system, var
    # The credentials: sentinels inside; the copy under an innocent name is gone, and said so.
    sent = seen["sentinels"]
    assert sent["EXAMPLE_API_KEY"].startswith("sk-sandgate-sentinel-") and REAL not in sent["EXAMPLE_API_KEY"]
    assert sent["REGISTRY_TOKEN"].startswith("npm_sandgate-sentinel-")
    assert sent["LABEL_COPY"] is None
    rec = next(x for x in read_records(audit) if x["event"] == "policy")
    assert "LABEL_COPY" in rec["env_dropped"] and str(d / "registry-token") in rec["hidden"]
    # Nothing readable inside holds a real secret or a private key; the scan did look.
    assert seen["hits"] == [[str(d / "home" / "control.txt"), control[:12]]], seen["hits"]
    assert FILE_SECRET not in seen["token_file"] and seen["token_file"] in ("", "error: Permission denied")
    # The control: without sandgate the same file and variable are there to be found.
    assert FILE_SECRET in (d / "registry-token").read_text()


def test_pythons_default_context_trusts_the_ca_by_variable_and_by_the_system_path(base: tuple[World, Path]) -> None:
    w, d = base
    caller = {"EXAMPLE_API_KEY": REAL}
    r, audit = _run(w, d, ["python3", "-c", SSL_PROBE], caller, "ssl-var")
    assert r.returncode == 0, r.stderr
    assert any(_task(audit) in s.get("commonName", "") for s in json.loads(r.stdout))
    # SSL_CERT_FILE removed inside: the bind over the system bundle alone carries the trust.
    r, audit = _run(w, d, ["env", "-u", "SSL_CERT_FILE", "python3", "-c", SSL_PROBE], caller, "ssl-path")
    assert r.returncode == 0, r.stderr
    subjects = json.loads(r.stdout)
    assert any(_task(audit) in s.get("commonName", "") for s in subjects) and len(subjects) > 10


def test_a_missing_secret_is_one_line_and_nothing_runs(base: tuple[World, Path]) -> None:
    w, d = base
    r, _ = _run(w, d, ["touch", str(d / "ws" / "ran")], {}, "missing")
    assert r.returncode == 125 and not (d / "ws" / "ran").exists()
    assert r.stderr.strip().splitlines() == [
        f"sandgate: error: {d}/missing.yaml:9: credential for api.example.test needs $EXAMPLE_API_KEY "
        "(set it, or give file:)"
    ]


def test_only_a_run_that_inspects_imports_cryptography(base: tuple[World, Path]) -> None:
    """`sandgate run -- true` with a plain policy must not pay for cryptography; with inspection it does."""
    w, d = base
    plain, inspecting = d / "plain.yaml", d / "inspect-only.yaml"
    plain.write_text("version: 1\nnetwork:\n  allow: [plain.test]\n")
    inspecting.write_text("version: 1\nnetwork:\n  allow:\n    - host: a.inspect.test\n      inspect: true\n")
    loaded = []
    for p in (plain, inspecting):
        line = [sys.executable, "-X", "importtime", *SANDGATE[1:], "run", *VIEW, "-q", "--policy", str(p), "--", "true"]
        r = w.run(line, cwd=d / "ws", env={**env(), "HOME": str(d / "home")}, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        loaded.append(any(x.split("|")[-1].strip().startswith("cryptography") for x in r.stderr.splitlines()))
    assert loaded == [False, True]
    assert REPO.is_dir()


def test_sandgate_proxy_writes_only_its_ca_certificate_and_announces_it(base: tuple[World, Path]) -> None:
    from ..support.runner import Proxy

    w, d = base
    inspecting, plain = d / "proxy-inspect.yaml", d / "proxy-plain.yaml"
    inspecting.write_text("version: 1\nnetwork:\n  allow:\n    - host: a.inspect.test\n      inspect: true\n")
    plain.write_text("version: 1\nnetwork:\n  allow: [plain.test]\n")
    px = Proxy(w, inspecting, listen="127.0.0.1:3191")
    try:
        ca_path = Path(px.ready["ca"])
        assert ca_path == px.audit.with_suffix(".ca.pem") and (ca_path.stat().st_mode & 0o777) == 0o644
        text = ca_path.read_text()
        assert "PRIVATE KEY" not in text and text.count("BEGIN CERTIFICATE") == 1
        nc = x509.load_pem_x509_certificate(text.encode()).extensions.get_extension_for_class(x509.NameConstraints)
        assert [n.value for n in nc.value.permitted_subtrees or []] == ["a.inspect.test"]
    finally:
        px.stop()
    assert px.proc.stderr is not None
    assert f"clients must trust the CA certificate {ca_path}" in px.proc.stderr.read().decode()
    other = Proxy(w, plain, listen="127.0.0.1:3192")
    try:
        assert "ca" not in other.ready and not other.audit.with_suffix(".ca.pem").exists()
    finally:
        other.stop()


def test_an_unprivileged_user_gets_the_same_trust_and_sentinels(base: tuple[World, Path]) -> None:
    """Rootless: the bind over the system bundle is made inside the user's own namespaces, the
    credential file is the user's own, and the run directory lives under the user's /tmp runtime dir."""
    from ..support.rootless import UnprivilegedUser

    w, _ = base
    with UnprivilegedUser(base_dir="/var/tmp") as u:  # a home under /tmp would vanish in the private /tmp
        work = u.home / "work"
        work.mkdir()
        token = u.home / "registry-token"
        token.write_text(FILE_SECRET + "\n")
        token.chmod(0o600)
        policy = u.home / "policy.yaml"
        policy.write_text(POLICY.format(token=token))
        (u.home / "probe.py").write_text(PROBE)
        for p in (work, token, policy, u.home / "probe.py"):
            os.chown(p, u.uid, u.gid)
        sg = Sandgate(u.runner(w), policy=policy, audit=u.home / "audit.jsonl", cwd=work, timeout=90, quiet=True)
        roots = ",".join(["/tmp", str(u.home), "/run"])
        cmd = ["python3", str(u.home / "probe.py"), ",".join(trustpaths.BUNDLE_VARIABLES), roots, str(token), _SKIP]
        r = sg.run(
            cmd=cmd,
            env={**u.env(), "PYTHONPATH": str(REPO), "EXAMPLE_API_KEY": REAL},
            input=",".join([REAL, FILE_SECRET, "PRIVATE KEY"]),
        )
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        assert "sandgate" in _ca_of(seen["system"]).subject.rfc4514_string()
        assert {p for p, _ in seen["vars"].values()} == {"/etc/ssl/certs/ca-certificates.crt"}
        assert all(text == seen["system"] for _, text in seen["vars"].values())
        assert seen["sentinels"]["EXAMPLE_API_KEY"].startswith("sk-sandgate-sentinel-")
        assert seen["hits"] == [] and FILE_SECRET not in seen["token_file"]
        assert FILE_SECRET in token.read_text()  # the control: outside, the file holds it

"""The inspection probes (issue 13): request rules, the run's CA, brokered credentials, passthrough.

Verify's policy inspects three fake hosts (selftest/inspectnet.py): a git host that may
be cloned but not pushed to, an API host with method/path rules and the one brokered credential,
and another host that takes any request but never a sentinel. Each probe tries the real thing
through the explicit proxy, as well-behaved tools (git, SDKs) do, trusting only what the sandbox
trusts by default (no cafile): the run's CA must be there for anything to work. A refusal counts
only as sandgate's 403 naming its reason and rule; a TLS failure or an upstream error is not a
refusal. What reached the upstreams is judged outside from their logs. Stdlib only.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path

from selftest.probes import readable
from selftest.probes.core import Blocked, Ctx, Result, Unsupported, attempt, combine, describe, probe
from selftest.probes.netio import BODY_LIMIT, HTTP_TIMEOUT, USER_AGENT, blind_context, proxy_address, says

#: Where the heavy inspection probes run: the command itself. What they judge is the daemon's
#: handling of each request (rules, trust, brokering), which is the same whichever process of the
#: tree sends it; that every process's traffic reaches the daemon at all is what the other network
#: rows check in every context. Repeating a clone, a push and two file searches in the grandchild
#: and the daemon only cost `sandgate verify` (and CI) time.
INSPECTION_CONTEXTS = ("child",)

Ask = tuple[str, str, dict[str, str]]  # method, target, extra headers
GIT_TIMEOUT = 15.0
REFUSED = b"sandgate: request refused: "
LEAK = b"sandgate: attempted credential leak: "


class _Counted(http.client.HTTPSConnection):
    """Counts its connections: http.client opens a new one by itself after a reply that closed it."""

    opened = 0

    def connect(self) -> None:
        self.opened += 1
        super().connect()


def exchange(host: str, asks: list[Ask]) -> tuple[list[tuple[int, bytes]], int]:
    """The requests in turn on one kept-alive connection to host:443 through the explicit proxy's tunnel;
    the replies, and how many connections they took (1: every request judged on the same one).

    Default trust (ssl.create_default_context()): whatever the sandbox trusts, nothing more.
    """
    conn = _Counted(*proxy_address("https"), timeout=HTTP_TIMEOUT, context=ssl.create_default_context())
    conn.set_tunnel(host, 443)
    out = []
    try:
        for method, target, headers in asks:
            conn.request(method, target, headers={"User-Agent": USER_AGENT, **headers})
            resp = conn.getresponse()
            out.append((resp.status, resp.read(BODY_LIMIT)))
    except (OSError, http.client.HTTPException) as e:
        raise Unsupported(f"{host}: the exchange itself failed, so nothing can be judged: {describe(e)}") from e
    finally:
        conn.close()
    return out, conn.opened


def refusal(status: int, body: bytes, why: bytes) -> Result:
    """Blocked only for sandgate's 403 with `why` and the deciding rule; a 2xx got through; else cannot tell."""
    if 200 <= status < 300:
        return "permitted", f"HTTP {status}: {body[:80]!r}"
    if status == 403 and body.startswith(why) and b"(rule " in body:
        return "blocked", f"403 {body.decode(errors='replace').strip()[:160]}"
    return "unsupported", f"HTTP {status} is not sandgate's refusal: {body[:120]!r}"


def controls(host: str, replies: list[tuple[int, bytes]], labels: list[str]) -> None:
    for label, (status, body) in zip(labels, replies, strict=True):
        if status != 200 or not says(body, host):
            raise Unsupported(f"the allowed {label} was not served (HTTP {status}: {body[:100]!r}): cannot tell")


@probe("network", "inspected_ca_trusted", "permitted")
def inspected_ca_trusted(c: Ctx) -> Result:
    """Control: the run's CA is trusted inside, so an inspected host verifies with Python's default context."""
    proxy = proxy_address("https")
    conn = http.client.HTTPSConnection(*proxy, timeout=HTTP_TIMEOUT, context=ssl.create_default_context())
    conn.set_tunnel(c.spec.other_host, 443)
    try:
        conn.request("GET", f"/ctl/{c.mark}/trusted", headers={"User-Agent": USER_AGENT})
        resp = conn.getresponse()
        body = resp.read(BODY_LIMIT)
        sock = conn.sock
        cert = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    except ssl.SSLError as e:
        raise Blocked(f"TLS to {c.spec.other_host} not trusted inside: {e}") from e
    finally:
        conn.close()
    issuer = dict(x[0] for x in (cert or {}).get("issuer", ()))  # type: ignore[misc]
    ok = resp.status == 200 and says(body, c.spec.other_host)
    return ("permitted" if ok else "blocked"), f"HTTP {resp.status}, leaf issued by {issuer.get('commonName')!r}"


def _git(args: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false"}
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT, check=False
        )
    except FileNotFoundError as e:
        raise Unsupported("git is not installed here") from e


def _clone(c: Ctx, where: str) -> str:
    """Clone the fake repository (through HTTPS_PROXY, trusting the sandbox's bundle); its HEAD."""
    proxy_address("https")  # a proxy probe without a proxy proves nothing
    r = _git(["clone", "-q", c.spec.git_url, where])
    if r.returncode != 0:
        raise Blocked(f"git clone failed ({r.returncode}): {r.stderr.strip()[-200:]}")
    return _git(["-C", where, "rev-parse", "HEAD"]).stdout.strip()


@probe("network", "git_fetch_inspected", "permitted", contexts=INSPECTION_CONTEXTS)
def git_fetch_inspected(c: Ctx) -> Result:
    """Control: git clone and fetch from an inspected git host whose rules allow reading (upload-pack)."""
    with tempfile.TemporaryDirectory(prefix="sandgate-verify-git-") as tmp:
        head = _clone(c, f"{tmp}/clone")
        if head != c.spec.git_head:
            return "blocked", f"cloned, but HEAD is {head[:12]}, not the fake repository's {c.spec.git_head[:12]}"
        r = _git(["-C", f"{tmp}/clone", "fetch", "-q", "origin"])
        if r.returncode != 0:
            return "blocked", f"cloned {head[:12]}, then git fetch failed: {r.stderr.strip()[-200:]}"
    return "permitted", f"cloned and fetched {head[:12]} through the inspecting proxy"


@probe("network", "git_push_refused", "blocked", contexts=INSPECTION_CONTEXTS)
def git_push_refused(c: Ctx) -> Result:
    """git push to an inspected host whose rules allow only clone and fetch (receive-pack is refused)."""
    with tempfile.TemporaryDirectory(prefix="sandgate-verify-git-") as tmp:
        work = f"{tmp}/clone"
        try:
            _clone(c, work)
        except Blocked as e:
            raise Unsupported(f"the clone before the push failed: {e}") from e
        Path(work, "pushed").write_text(f"{c.mark}\n")
        ident = ["-c", "user.name=verify", "-c", "user.email=verify@sandgate.test"]
        if (
            _git(["-C", work, "add", "pushed"]).returncode
            or _git(["-C", work, *ident, "commit", "-qm", c.mark]).returncode
        ):
            raise Unsupported("cannot commit in the clone: cannot tell")
        r = _git(["-C", work, "push", "-q", "origin", f"HEAD:refs/heads/verify-{c.mark}"])
    if r.returncode == 0:
        return "permitted", f"pushed branch verify-{c.mark}"
    if "403" in r.stderr:
        return "blocked", f"git push refused: {r.stderr.strip()[-160:]}"
    return "unsupported", f"git push failed, but not with a 403: {r.stderr.strip()[-200:]}"


@probe("network", "http_rule_refusals", "blocked")
def http_rule_refusals(c: Ctx) -> Result:
    """Methods and paths the inspected host's http rules do not cover (DELETE, POST elsewhere, dot segments), kept-alive."""
    ok = f"/v1/ok/{c.mark}"
    refused: list[Ask] = [
        ("DELETE", f"{c.path}/delete", {}),
        ("POST", f"{c.path}/post", {}),
        ("POST", f"/v1/..{c.path}/dots", {}),  # read as /v1/** by a naive glob, as /verify/... upstream
        ("POST", f"/v1/%2e%2e{c.path}/escaped-dots", {}),
    ]
    asks = [("GET", ok, {}), ("POST", ok, {}), *refused, ("GET", ok, {})]
    replies, opened = exchange(c.spec.api_host, asks)
    controls(c.spec.api_host, [replies[0], replies[1], replies[-1]], ["GET", "POST under /v1/", "GET after"])
    parts = [(f"{m} {t}", refusal(*replies[i + 2], REFUSED)) for i, (m, t, _) in enumerate(refused)]
    observed, detail = combine(parts, need="any")
    return observed, f"{len(asks)} requests on {opened} connection(s); {detail}"


def sentinel_of(c: Ctx) -> str:
    """The credential's variable as the sandbox sees it: a sentinel (else the probe cannot tell)."""
    value = os.environ.get(c.spec.cred_env)
    if not value:
        raise Unsupported(f"${c.spec.cred_env} is not set inside: a tool that needs it would not start")
    if hashlib.sha256(value.encode()).hexdigest() == c.spec.cred_sha256:
        raise Unsupported(f"${c.spec.cred_env} holds the real secret (secret_brokered reports it)")
    return value


@probe("network", "sentinel_leak", "blocked")
def sentinel_leak(c: Ctx) -> Result:
    """The credential's sentinel sent to another allowed host (a header, the URL; plain HTTP too): an attempted leak."""
    sentinel, host = sentinel_of(c), c.spec.other_host
    asks: list[Ask] = [
        ("GET", f"/ctl/{c.mark}/leak", {}),
        ("GET", f"{c.path}/header", {"Authorization": f"Bearer {sentinel}"}),
        ("GET", f"{c.path}/query?api_key={sentinel}", {}),
    ]
    replies, _ = exchange(host, asks)
    controls(host, replies[:1], ["GET without the sentinel"])
    parts = [(f"{t.split('?')[0]}", refusal(*replies[i + 1], LEAK)) for i, (_, t, _) in enumerate(asks[1:])]
    parts.append(("plain HTTP", attempt(_plain_leak, c, sentinel)))
    return combine(parts, need="any")


def _plain_leak(c: Ctx, sentinel: str) -> Result:
    """The sentinel over plain HTTP to the allowed host (never inspected, never bound) via HTTP_PROXY."""
    host, port = proxy_address("http")
    with socket.create_connection((host, port), timeout=HTTP_TIMEOUT) as s:
        target = f"http://{c.spec.allowed_host}{c.path}/plain"
        s.sendall(
            f"GET {target} HTTP/1.1\r\nHost: {c.spec.allowed_host}\r\nUser-Agent: {USER_AGENT}\r\n"
            f"Authorization: Bearer {sentinel}\r\nConnection: close\r\n\r\n".encode()
        )
        resp = http.client.HTTPResponse(s, method="GET")
        resp.begin()
        return refusal(resp.status, resp.read(BODY_LIMIT), LEAK)


def shared_start(a: str, b: str) -> str:
    """The longest text both start with."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@probe("network", "sentinel_prefix", "blocked", contexts=INSPECTION_CONTEXTS)
def sentinel_prefix(c: Ctx) -> Result:
    """The sentinel starting with part of a secret that has no vendor prefix (v2 kept up to 11 characters)."""
    sentinel = sentinel_of(c)
    ((status, body),), _ = exchange(
        c.spec.api_host, [("GET", f"/v1/sentinel-prefix/{c.mark}", {"Authorization": f"Bearer {sentinel}"})]
    )
    if status != 200:  # the control: the sentinel is the credential the bound host is served with
        raise Unsupported(f"the request to the bound host was not served (HTTP {status}: {body[:100]!r})")
    kept = shared_start(sentinel, c.spec.cred_prefix)
    if kept:
        return "permitted", f"the sentinel starts with {kept!r}, the secret's first {len(kept)} character(s)"
    return "blocked", f"the sentinel {sentinel[:18]!r}... starts with none of the secret ({c.spec.cred_prefix!r}...)"


@probe("network", "secret_brokered", "blocked", contexts=INSPECTION_CONTEXTS)
def secret_brokered(c: Ctx) -> Result:
    """Reading the brokered credential's real secret anywhere inside (env, /proc/*/environ, files) while its host gets it."""
    value = os.environ.get(c.spec.cred_env, "")
    if hashlib.sha256(value.encode()).hexdigest() == c.spec.cred_sha256:
        return "permitted", f"${c.spec.cred_env} holds the real secret"
    sentinel = sentinel_of(c)
    shape = re.compile(re.escape(c.spec.cred_prefix.encode()) + rb"[0-9a-f]{32}")
    search = readable.Search(c.spec.home, (c.spec.results_dir,))
    for where, data in search:
        for found in set(shape.findall(data)):
            if hashlib.sha256(found).hexdigest() == c.spec.cred_sha256:
                return "permitted", f"the real secret is readable in {where}"
    # The bound host gets the real header for the sentinel (judged outside, from its log).
    ((status, body),), _ = exchange(
        c.spec.api_host, [("GET", f"/v1/broker/{c.mark}", {"Authorization": f"Bearer {sentinel}"})]
    )
    if status != 200:
        raise Unsupported(f"the request to the bound host was not served (HTTP {status}: {body[:100]!r})")
    return "blocked", f"${c.spec.cred_env} holds a sentinel ({len(sentinel)} chars); {search.summary()}"


KEY = re.compile(rb"-----BEGIN ((?:[A-Z]+ )*)PRIVATE KEY-----.+?-----END \1PRIVATE KEY-----", re.DOTALL)
CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def _matches(key: bytes, certs: list[bytes], tmp: str) -> int:
    """How many of `certs` this private key belongs to (ssl refuses a cert/key pair that does not match)."""
    Path(tmp, "key.pem").write_bytes(key)
    hits = 0
    for i, cert in enumerate(certs):
        path = Path(tmp, f"cert-{i}.pem")
        if not path.exists():
            path.write_bytes(cert)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(path), str(Path(tmp, "key.pem")))
        except ssl.SSLError:
            continue
        hits += 1
    return hits


@probe("network", "ca_key_hidden", "blocked", contexts=INSPECTION_CONTEXTS)
def ca_key_hidden(c: Ctx) -> Result:
    """Reading the private key of a CA the sandbox trusts (the run's inspection CA): it could then sign for any host."""
    certs = list(dict.fromkeys(m for b in readable.bundles() for m in CERT.findall(readable.read_regular(b) or b"")))
    if not certs:
        raise Unsupported("no CA bundle with certificates is readable here: cannot tell")
    keys: dict[bytes, str] = {}
    search = readable.Search(c.spec.home, (c.spec.results_dir,))
    for where, data in search:
        for text in {data, data.replace(b"\\n", b"\n")}:  # a key inside JSON (a spec) has escaped newlines
            for m in KEY.finditer(text):
                keys.setdefault(m.group(0), where)
    with tempfile.TemporaryDirectory(prefix="sandgate-verify-keys-") as tmp:
        for key, where in keys.items():
            if _matches(key, certs, tmp):
                return "permitted", f"the private key of a trusted CA is readable in {where}"
    found = f" (in {', '.join(sorted(set(keys.values()))[:2])}{', ...' if len(set(keys.values())) > 2 else ''})"
    return "blocked", (
        f"{len(keys)} private key(s){found if keys else ''}, none of any of {len(certs)} trusted CAs; {search.summary()}"
    )


def _presented(c: Ctx, via_proxy: bool) -> Result:
    """The certificate the passthrough host shows us, compared with the one it presents without the sandbox."""
    host = c.spec.allowed_host
    if via_proxy:
        conn = http.client.HTTPSConnection(*proxy_address("https"), timeout=HTTP_TIMEOUT, context=blind_context())
        conn.set_tunnel(host, 443)
    else:
        conn = http.client.HTTPSConnection(host, 443, timeout=HTTP_TIMEOUT, context=blind_context())
    try:
        conn.request("GET", f"/ctl/{c.mark}/passthrough", headers={"User-Agent": USER_AGENT})
        status = conn.getresponse().status
        sock = conn.sock
        der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    finally:
        conn.close()
    seen = hashlib.sha256(der or b"").hexdigest()
    if seen != c.spec.passthrough_sha256:
        return (
            "blocked",
            f"intercepted: the client saw certificate {seen[:16]}, the host's is {c.spec.passthrough_sha256[:16]}",
        )
    return ("permitted" if status == 200 else "blocked"), f"the host's own certificate {seen[:16]}, HTTP {status}"


@probe("network", "passthrough_untouched", "permitted")
def passthrough_untouched(c: Ctx) -> Result:
    """Control: a host the policy does not inspect presents its own certificate to the client (TLS passed through)."""
    return combine(
        [("explicit proxy", attempt(_presented, c, True)), ("transparent", attempt(_presented, c, False))],
        need="all",
    )

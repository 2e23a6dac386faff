"""Issue 13's corner of verify's fake internet: inspected upstreams, a brokered credential, their evidence.

Run OUTSIDE by verify, never inside. Three fake hosts that verify's policy inspects, each an
upstream canary recording every request with its headers (canary/upstream_canary.py):

  git.verify.test    git smart HTTP over TLS (the real `git http-backend`), a one-commit repository
                     with receive-pack enabled: only sandgate's http rules keep a push out
  api.verify.test    read-only plus POST under /v1/, WebSocket upgrades under /v1/ws/, the one
                     brokered credential (its secret has no vendor prefix)
  other.verify.test  inspected, every request allowed: where a sentinel must not go

The controls prove, without the sandbox, that each answers, that the repository takes a push
and what certificate the passthrough host presents; so a refusal inside is sandgate's doing. The
real secret lives in verify's process and the launcher's environment only: the probes get its
SHA-256, never the value (the spec is readable inside).
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from netguard import audit
from selftest import markers
from selftest.errors import VerifyError
from selftest.probes.core import CONTEXTS
from selftest.servers import Server
from selftest.world import Canary, World

GIT_HOST, GIT_IP = "git.verify.test", "198.51.100.30"
API_HOST, API_IP = "api.verify.test", "198.51.100.31"
OTHER_HOST, OTHER_IP = "other.verify.test", "198.51.100.32"
REPO_PATH = "/verify/repo.git"
CRED_ENV = "SANDGATE_VERIFY_API_KEY"
#: + 32 hex digits: the shape the probes search for, never the value. No vendor prefix (issue 24):
#: the sentinel must keep none of it (sentinel_prefix; v2 kept "verifyreal-").
CRED_PREFIX = "verifyreal-"
CONTROL_AGENT = "sandgate-verify-control"

#: verify's policy entries for them (appended to fakenet.POLICY's allow list) and the credential.
ALLOW = f"""\
    - host: {GIT_HOST}      # github-readonly's shape: clone and fetch, never push
      http:
        - read-only
        - methods: [POST]
          paths: ["/*/*/git-upload-pack"]
    - host: {API_HOST}
      http:
        - read-only
        - methods: [POST]
          paths: ["/v1/**"]
        - methods: [GET]
          paths: ["/v1/ws/**"]
          websocket: true   # the control of websocket_upgrade: only here may a GET upgrade
    - host: {OTHER_HOST}
      inspect: true         # every request allowed, each audited: but never a sentinel
"""
CREDENTIALS = f"""\
  credentials:
    - host: {API_HOST}
      value: "Bearer ${{{CRED_ENV}}}"
"""


@dataclass(frozen=True)
class InspectFacts:
    """What build made: the servers whose logs are the evidence, and what the probes are told."""

    git: Server
    api: Server
    other: Server
    repo: Path
    git_head: str
    real_secret: str  # outside only: the launcher's environment, and the judge's comparison
    passthrough_sha256: str  # of the certificate allowed.verify.test presents, seen without the sandbox

    @property
    def secret_sha256(self) -> str:
        return hashlib.sha256(self.real_secret.encode()).hexdigest()


@dataclass(frozen=True)
class Upstreams:
    """What prepare made: the repository the git host serves, and the three canaries (git, api, other) to start."""

    repo: Path
    git_head: str
    canaries: tuple[Canary, Canary, Canary]


def prepare(w: World) -> Upstreams:
    """The three upstreams' names and repository; their canaries start with verify's others (serve_many)."""
    repo, head = _repository(w.tmp / "git", w.tmp / "seed")
    w.add_host(GIT_HOST, GIT_IP)
    w.add_host(API_HOST, API_IP)
    w.add_host(OTHER_HOST, OTHER_IP)
    git = Canary("git", GIT_IP, 443, GIT_HOST, git_root=w.tmp / "git")
    api, other = Canary("upstream", API_IP, 443, API_HOST), Canary("upstream", OTHER_IP, 443, OTHER_HOST)
    return Upstreams(repo, head, (git, api, other))


def build(w: World, ups: Upstreams, started: Mapping[Canary, Server], passthrough: tuple[str, str]) -> InspectFacts:
    """The controls, once ups' canaries (`started`, by Canary) are ready; `passthrough`: (host, ip), an https canary."""
    git, api, other = (started[c] for c in ups.canaries)
    _control_push(w, w.tmp / "control")
    for host in (API_HOST, OTHER_HOST):
        _control_get(w, host)
    fingerprint = _fingerprint(w, *passthrough)
    real = CRED_PREFIX + secrets.token_hex(16)
    return InspectFacts(git, api, other, ups.repo, ups.git_head, real, fingerprint)


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    r = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise VerifyError(
            f"git {' '.join(args[:2])} failed while building the fake git host: {r.stderr.strip()[-300:]}"
        )
    return r.stdout.strip()


def _repository(root: Path, seed: Path) -> tuple[Path, str]:
    """A bare one-commit repository that accepts pushes over HTTP (only the policy refuses them)."""
    bare = root / REPO_PATH.lstrip("/")
    bare.parent.mkdir(parents=True)
    _git("init", "-q", "--bare", "-b", "main", str(bare))
    _git("-C", str(bare), "config", "http.receivepack", "true")
    _git("init", "-q", "-b", "main", str(seed))
    (seed / "README").write_text("the fake git host of sandgate verify\n")
    _git("-C", str(seed), "add", "README")
    _git("-C", str(seed), "-c", "user.name=verify", "-c", "user.email=verify@sandgate.test", "commit", "-qm", "seed")
    _git("-C", str(seed), "push", "-q", str(bare), "main")
    return bare, _git("-C", str(bare), "rev-parse", "refs/heads/main")


CONTROL_PUSH = """\
set -e
git -c http.sslCAInfo="$1" clone -q "https://{host}{repo}" "$2"
cd "$2"
echo control > control
git add control
git -c user.name=verify -c user.email=verify@sandgate.test commit -qm control
git -c http.sslCAInfo="$1" -c http.userAgent={agent} push -q origin HEAD:refs/heads/control
"""


def _control_push(w: World, work: Path) -> None:
    """Without the sandbox the fake host takes a push: so a push refused inside is the policy's doing."""
    script = CONTROL_PUSH.format(host=GIT_HOST, repo=REPO_PATH, agent=CONTROL_AGENT)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work.parent), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    r = w.run(["sh", "-c", script, "control", str(w.ca_pem), str(work)], env=env)
    if r.returncode != 0:
        raise VerifyError(f"the fake git host refuses a push even without the sandbox: {r.stderr.strip()[-300:]}")


CONTROL_GET = """\
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
with opener.open(f"https://{sys.argv[1]}/control", timeout=5) as r:
    assert r.status == 200 and f"hello from {sys.argv[1]}".encode() in r.read(4096), r.status
"""


def _control_get(w: World, host: str) -> None:
    r = w.run([sys.executable, "-c", CONTROL_GET, host, str(w.ca_pem)])
    if r.returncode != 0:
        raise VerifyError(f"the upstream canary {host} does not answer even without the sandbox: {r.stderr[-300:]}")


FINGERPRINT = """\
import hashlib, socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
with socket.create_connection((sys.argv[2], 443), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=sys.argv[1]) as s:
    print(hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest())
"""


def _fingerprint(w: World, host: str, ip: str) -> str:
    """The certificate the passthrough host presents, seen from the world without the sandbox."""
    r = w.run([sys.executable, "-c", FINGERPRINT, host, ip])
    if r.returncode != 0 or len(r.stdout.strip()) != 64:
        raise VerifyError(f"cannot read the certificate of {host} even without the sandbox: {r.stderr[-300:]}")
    return str(r.stdout.strip())


# ---- evidence after one pass -----------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """After a pass: what shows a blocked probe got through (`seen`), and what is missing for a row to hold."""

    seen: dict[tuple[str, str], str]
    missing: dict[tuple[str, str], str]


SENTINEL_MARK = "sandgate-sentinel-"  # what every sentinel holds (netguard.credentials.sentinel_for)


def evidence(f: InspectFacts, tag: str, servers: list[Server], kept: list[Path]) -> Evidence:
    """The repository, the upstreams' logs and sandgate's own files (`kept`: the audit log, the daemon's
    log), read after the pass tagged `tag`; `servers`: every canary of the world."""
    seen: dict[tuple[str, str], str] = {}
    missing: dict[tuple[str, str], str] = {}
    pushes = [
        r
        for r in f.git.log_records("request")
        if r["method"] == "POST" and "git-receive-pack" in r["path"] and r["headers"].get("user-agent") != CONTROL_AGENT
    ]
    if pushes:
        seen["git_push_refused", "*"] = f"the fake git host got {len(pushes)} receive-pack POST(s)"
    refs = _git("-C", str(f.repo), "for-each-ref", "--format=%(refname)").split()
    seen.update(_secret_seen(f, servers, kept))
    leaks = _attempted_leaks(kept[0]) if kept else set()
    for ctx in CONTEXTS:
        mark = markers.mark(ctx, tag)
        if f"refs/heads/verify-{mark}" in refs:
            seen["git_push_refused", ctx] = f"the fake repository has the pushed branch verify-{mark}"
        if why := _not_brokered(f, mark):
            missing["secret_brokered", ctx] = why
        if why := _leak_unrecorded(leaks, mark):
            missing["sentinel_leak", ctx] = why
    return Evidence(seen, missing)


def _secret_seen(f: InspectFacts, servers: list[Server], kept: list[Path]) -> dict[tuple[str, str], str]:
    """Where the real secret or a sentinel went that it must not: sandgate's files, any other upstream."""
    seen: dict[tuple[str, str], str] = {}
    for path in kept:
        if path.is_file() and f.real_secret in path.read_text(errors="replace"):
            seen["secret_brokered", "*"] = f"sandgate's {path.name} holds the real secret"
    for server in servers:
        if server is f.api:
            continue  # the bound host: the real header is meant for it (checked per request)
        text = server.log_path.read_text(errors="replace")
        if f.real_secret in text:
            seen["secret_brokered", "*"] = f"the real secret reached {server.name}, which it is not bound to"
        if SENTINEL_MARK in text:
            seen["sentinel_leak", "*"] = f"a sentinel reached {server.kind} {server.name} {server.address}"
        if server.kind in ("upstream", "git") and any("/fronted" in r["path"] for r in server.log_records("request")):
            seen["credential_fronting", "*"] = f"{server.name} got a request meant for {API_HOST} (Host header)"
    return seen


def broker_path(mark: str) -> str:
    """The path of secret_brokered's request to the bound host (no marker: it is meant to get through)."""
    return f"/v1/broker/{mark}"


def _not_brokered(f: InspectFacts, mark: str) -> str:
    """Why the bound upstream did not get the real secret for this context's request ("" when it did)."""
    got = [r for r in f.api.log_records("request") if r["path"] == broker_path(mark)]
    if not got:
        return f"the bound upstream {API_HOST} never got the request {broker_path(mark)}"
    auth = str(got[-1]["headers"].get("authorization", ""))
    if auth != f"Bearer {f.real_secret}":
        shown = "no Authorization header" if not auth else f"Authorization {auth[:12]}... (not the real secret)"
        return f"the bound upstream {API_HOST} got {shown}"
    return ""


def _attempted_leaks(audit_log: Path) -> set[str]:
    """The paths of the refused attempts to leak CRED_ENV's sentinel, by the one reader of audit logs."""
    try:
        records = audit.read_records(audit_log)
    except (OSError, audit.LogError):  # a log that does not read shows no refusal
        return set()
    return {r["path"] for r in records if r["event"] == "request" and r["action"] == "deny" and r["leak"] == CRED_ENV}


def _leak_unrecorded(leaks: set[str], mark: str) -> str:
    """Which of sentinel_leak's refusals are not in the audit log as attempted leaks ("" when all are)."""
    base = markers.http_path(mark, "sentinel_leak")
    absent = [p for p in (f"{base}/header", f"{base}/query", f"{base}/plain") if p not in leaks]
    return f"no attempted-leak record in the audit log for {', '.join(absent)}" if absent else ""

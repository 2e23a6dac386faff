"""The inspected_front_door row: the front door's own inspected path, judged by what the git canary saw.

Why a run of its own: the front door serves inspected HTTPS itself (netguard.daemon.tlshttp.takes) only in
a run that brokers no credential and has no corporate proxy, and an explicit CONNECT only once the run has
seen that upstream answer HTTP/1.1. The probe run's policy brokers a credential (inspectnet.CREDENTIALS),
so none of its requests take that path, and a user's verify would not notice the front door's request
rules broken. Here: a policy with the git host's github-readonly entry alone, a first GET through
mitmproxy that teaches the run HTTP/1.1, then every request on a new connection, the front door's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from selftest import markers
from selftest.hostrows import FRONT_DOOR
from selftest.inspectnet import GIT_HOST, OTHER_HOST, REPO_PATH
from selftest.judge import Row, canary_hits
from selftest.passes import Pass, base_env, side_output, side_run, side_tree
from selftest.world import World

CONTEXT = "child"  # the command itself: what the front door serves is the same for every process
AUDIT_FRONT_DOOR = "audit-frontdoor.jsonl"
#: inspectnet.ALLOW's git entry, alone: no credential, so the front door (not mitmproxy) may take it.
POLICY = f"""\
# sandgate verify's inspected_front_door row: github-readonly's shape, nothing brokered
version: 1
network:
  allow:
    - host: {GIT_HOST}
      http:
        - read-only
        - methods: [POST]
          paths: ["/*/*/git-upload-pack"]
"""
ALLOWED_STEPS = ("learn", "allowed", "after")  # GETs of info/refs: each must be served by the git host
REFUSED = "sandgate: request refused: "  # the start of the Gate's 403 body (inspected.refusal_text)
REFUSED_STEPS = {"push": "git-receive-pack", "fronted": "(domain fronting)"}  # step -> what its 403 must name

FRONT_DOOR_SCRIPT = """\
import http.client, json, os, ssl, sys, urllib.parse
host, repo, mark, other = sys.argv[1:5]
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or "")
refs = f"{repo}/info/refs?service=git-upload-pack"
out = {"proxy": proxy.geturl()}
def new():
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port or 80, timeout=10, context=ssl.create_default_context())
    conn.set_tunnel(host, 443)  # explicit CONNECT, as git does through HTTPS_PROXY
    return conn
def ask(step, conn, method, target, headers=None, body=None):
    try:
        conn.request(method, target, body=body, headers={"User-Agent": "sandgate-verify", **(headers or {})})
        r = conn.getresponse()
        got = r.read(4096).decode(errors="replace")
        out[step] = {"status": r.status, "sandgate": r.getheader("X-Sandgate"), "body": got[:400]}
    except Exception as e:
        out[step] = {"status": 0, "sandgate": None, "body": f"{type(e).__name__}: {e}"}
for step in ("learn", "allowed"):  # the first through mitmproxy (it learns HTTP/1.1), the second the front door's
    c = new(); ask(step, c, "GET", refs); c.close()
c = new()  # a push: what the read-only rules are for (receive-pack), marked in a header and the body
ask("push", c, "POST", f"{repo}/git-receive-pack", {"Content-Type": "application/x-git-receive-pack-request",
    "X-Sandgate-Verify": mark}, f"0000{mark}".encode())
c.close()
c = new()  # domain fronting (another origin in Host), then an allowed GET: a refusal must not end the connection
ask("fronted", c, "GET", mark + "/fronted", {"Host": other})
ask("after", c, "GET", refs)
c.close()
print(json.dumps(out))
"""


def front_door_row(w: World, p: Pass, base: Path, home: Path, secret: str, token: str, policy: str = POLICY) -> Row:
    """Outside the probe run: `sandgate run --policy` (POLICY, or the one a test widens) as this pass's
    identity, five requests through HTTPS_PROXY; judged by what the canaries saw, then by the replies."""
    ws = base / "frontdoor"
    ws.mkdir()
    pol = base / "frontdoor.yaml"
    pol.write_text(policy)
    pol.chmod(0o644)
    audit = side_tree(p, ws, AUDIT_FRONT_DOOR)
    mark = markers.mark("frontdoor", p.identity)
    # the git host's certificate comes from the world's CA
    cmd = [
        *side_run(p, audit, "--policy", str(pol), "--upstream-ca", str(w.ca_pem)),
        p.python,
        "-c",
        FRONT_DOOR_SCRIPT,
        GIT_HOST,
        REPO_PATH,
        markers.http_path(mark, FRONT_DOOR),
        OTHER_HOST,
    ]
    out, err = side_output(w, cmd, ws, base_env(home, secret, token))
    observed, evidence = verdict(out, err, upstream_hits(w, mark))
    return Row("network", FRONT_DOOR, CONTEXT, "blocked", observed, observed == "blocked", evidence, p.identity)


def upstream_hits(w: World, mark: str) -> list[dict[str, Any]]:
    """Every canary record of this pass's refused requests: its marker anywhere (the push's header and body,
    the fronted path); and any unmarked request to the git host whose Host named the other host."""
    hits = canary_hits(w, FRONT_DOOR, mark)
    for server in (s for s in w.servers if s.kind == "git"):
        for rec in server.log_records("request"):
            named = str(rec.get("host") or "").rsplit(":", 1)[0].rstrip(".").lower()
            if named == OTHER_HOST and FRONT_DOOR not in json.dumps(rec):  # a marked one is its own pass's
                hits.append({"server": f"{server.kind} {server.name} {server.address}", **rec})
    return hits


def verdict(out: str, err: str, hits: list[dict[str, Any]]) -> tuple[str, str]:
    """Pure: the canaries first, then the allowed GETs (the controls), then each refusal as sandgate's 403."""
    if hits:
        return "permitted", "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3])
    seen: dict[str, Any] | None = next((json.loads(x) for x in out.splitlines() if x.startswith("{")), None)
    if seen is None:
        return "unsupported", f"the command reported nothing: {err.strip()[-300:]}: cannot tell"
    if not seen.get("proxy"):
        return "unsupported", "no HTTPS_PROXY inside the sandbox: no explicit CONNECT to judge"
    for step in ALLOWED_STEPS:
        got = seen.get(step) or {}
        if got.get("status") != 200 or "service=git-upload-pack" not in str(got.get("body")):
            return "unsupported", f"the allowed GET ({step}) was not served: {_shown(got)}: cannot tell"
    refusals = []
    for step, names in REFUSED_STEPS.items():
        got = seen.get(step) or {}
        status, body = got.get("status"), str(got.get("body"))
        if isinstance(status, int) and 200 <= status < 300:
            return "permitted", f"{step}: answered {_shown(got)}"
        if status != 403 or got.get("sandgate") != "blocked" or not body.startswith(REFUSED):
            return "unsupported", f"{step}: not sandgate's refusal: {_shown(got)}"
        if names not in body:
            return "unsupported", f"{step}: refused, but not for its reason ({names}): {_shown(got)}"
        refusals.append(f"{step}: 403 {body.strip().removeprefix(REFUSED)[:240]}")
    return "blocked", "; ".join(refusals) + "; the git canary saw neither; the 3 allowed GETs got 200"


def _shown(got: dict[str, Any]) -> str:
    return f"HTTP {got.get('status')} X-Sandgate {got.get('sandgate')}: {str(got.get('body'))[:160]!r}"

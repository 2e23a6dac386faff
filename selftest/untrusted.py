"""The untrusted_workspace_policy row: a checkout's own `.sandgate.yaml`, never trusted, run without --policy."""

from __future__ import annotations

import json
from pathlib import Path

from selftest import markers
from selftest.fakenet import BLOCKED, BLOCKED_HOST, SECRET_ENV, VISIBLE_ENV
from selftest.hostrows import UNTRUSTED
from selftest.judge import Row, canary_hits
from selftest.passes import Pass, base_env, side_output, side_run, side_tree
from selftest.world import World

AUDIT_UNTRUSTED = "audit-untrusted.jsonl"
UNTRUSTED_POLICY = f"""\
# a checkout's own policy, never trusted: every key here would widen the sandbox
version: 1
network:
  allow:
    - {BLOCKED_HOST}
    - cidr: 0.0.0.0/1
    - cidr: 128.0.0.0/1
env:
  keep: ["*"]
filesystem:
  write: ["~"]
"""


UNTRUSTED_SCRIPT = """\
import json, os, socket, sys, urllib.error, urllib.request
host, ip, path, secret, visible = sys.argv[1:6]
out = {"secret_in": sorted(k for k, v in os.environ.items() if secret in v), "visible": visible in os.environ}
def get(opener, url):
    try:
        with opener.open(url, timeout=5) as r:
            return f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
out["by name, proxy variables"] = get(urllib.request.build_opener(), f"http://{host}{path}")
out["by name, transparent"] = get(urllib.request.build_opener(urllib.request.ProxyHandler({})), f"http://{host}{path}")
try:
    with socket.create_connection((ip, 80), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n".encode())
        out["by IP"] = s.recv(64).decode(errors="replace").split("\\r\\n")[0] or "closed"
except Exception as e:
    out["by IP"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def untrusted_row(w: World, p: Pass, base: Path, home: Path, secret: str, token: str) -> Row:
    """Outside the probe run: `sandgate run` WITHOUT --policy in a scratch checkout whose own .sandgate.yaml
    allows the blocked host, every IPv4 address, every variable and the home. Untrusted, only what it
    forbids may apply: the blocked canary sees nothing, the secret stays out, and sandgate says so."""
    ws = base / "untrusted"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text(UNTRUSTED_POLICY)
    audit = side_tree(p, ws, AUDIT_UNTRUSTED, ws / ".sandgate.yaml")
    mark = markers.mark("untrusted", p.identity)
    cmd = [
        *side_run(p, audit),
        p.python,
        "-c",
        UNTRUSTED_SCRIPT,
        BLOCKED_HOST,
        BLOCKED,
        markers.http_path(mark, UNTRUSTED),
        secret,
        VISIBLE_ENV,
    ]
    out, err = side_output(w, cmd, ws, base_env(home, secret, token))
    observed, evidence = _verdict(w, mark, out, err)
    return Row("filesystem", UNTRUSTED, "child", "blocked", observed, observed == "blocked", evidence, p.identity)


def _verdict(w: World, mark: str, out: str, err: str) -> tuple[str, str]:
    """What the canaries saw first, then what the command reported, then sandgate's notice."""
    seen = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    hits = canary_hits(w, UNTRUSTED, mark)
    notice = next((line for line in err.splitlines() if "is not trusted" in line), "")
    if hits:
        return "permitted", "canary saw it: " + "; ".join(json.dumps(h, sort_keys=True)[:300] for h in hits[:3])
    if seen and seen[0]["secret_in"]:
        return "permitted", f"{SECRET_ENV} reached the command as {', '.join(seen[0]['secret_in'])}"
    if not seen:
        return "unsupported", f"the command reported nothing: {err.strip()[-300:]}: cannot tell"
    if not seen[0]["visible"]:
        return "unsupported", f"the control variable {VISIBLE_ENV} is missing inside: cannot tell"
    if not notice:
        return "unsupported", f"no 'is not trusted' notice from sandgate: {err.strip()[-300:]}"
    tries = "; ".join(f"{k}: {v}" for k, v in seen[0].items() if k not in ("secret_in", "visible"))
    return "blocked", f"{tries}; secret absent; {notice[:200]}"

"""Issue 25 item 5, end to end: many kept-alive connections to an inspected registry never stall.

A cold `npm ci` through `--allow npm-readonly` fetched ~70 packuments over 15 connections and then
waited for ever: each inspected request opened a new upstream connection (the Gate's pin had
renamed the previous one to its IP, so mitmproxy did not reuse it), the old ones stayed open, and
mitmproxy lets one client connection hold 5 per address: the 6th request on a kept-alive
connection waited for a slot that never came. Here clients that behave like npm (several parallel
keep-alive connections, a dozen requests each, bodies of varied size) fetch from a fake registry
that answers like a CDN (head and body in separate writes, connections kept alive): every request
is answered, and the fake saw one upstream connection per client connection.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netguard.audit import read_records

from ..support import httpsfake, registryfake
from ..support.httpsfake import Fake
from ..support.runner import Sandgate, env
from ..support.world import World, new_world

REGISTRY = "198.51.100.81"
POLICY = "version: 1\nnetwork:\n  allow:\n    - host: registry.test\n      http:\n        - read-only\n"
NO_PROXY = ["env", "-u", "HTTPS_PROXY", "-u", "https_proxy", "-u", "ALL_PROXY", "-u", "all_proxy"]
SIZES = (1, 700, 5_000, 70_000, 300_000, 12)  # packuments of a few KB, tarballs up to hundreds
WORKERS, EACH = 6, 12  # more requests per connection than mitmproxy's 5 connections per address

#: npm's way: one https.Agent with keep-alive and a few sockets, many requests queued on it.
NODE = r"""
const https = require('https');
const agent = new https.Agent({keepAlive: true, maxSockets: 4});
const sizes = JSON.parse(process.argv[2]), total = +process.argv[3];
let done = 0;
for (let i = 0; i < total; i++) {
  const n = sizes[i % sizes.length];
  const req = https.get(`https://registry.test/bytes/${n}?node=${i}`, {agent, timeout: 10000}, r => {
    let got = 0; r.on('data', c => got += c.length);
    r.on('end', () => { console.log(JSON.stringify({name: `node.${i}`, status: r.statusCode, body: String(got), want: n}));
                         if (++done === total) agent.destroy(); });
  });
  req.on('timeout', () => req.destroy(new Error('timeout')));
  req.on('error', e => { console.log(JSON.stringify({name: `node.${i}`, status: 0, body: '', error: String(e)}));
                         if (++done === total) agent.destroy(); });
}
"""

SCRIPT = f"""
    import threading
    SIZES = {SIZES!r}
    def worker(w):
        c = connection("registry.test")
        for r in range({EACH}):
            n = SIZES[(w + r) % len(SIZES)]
            def go():
                c.request("GET", f"/bytes/{{n}}?w={{w}}&r={{r}}")
                resp = c.getresponse()
                return resp.status, str(len(resp.read()))
            guard(f"py.{{w}}.{{r}}", go)
    threads = [threading.Thread(target=worker, args=(w,)) for w in range({WORKERS})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p = subprocess.run(["node", "sgnode.js", json.dumps(SIZES), "40"], capture_output=True, text=True, timeout=60)
    print(p.stdout, p.stderr[-500:], flush=True)
    """


@dataclass
class Lab:
    world: World
    base: Path
    ws: Path
    policy: Path
    fake: Fake


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-keepalive-", dir="/var/tmp"))
    try:
        with new_world() as w:
            ws = base / "ws"
            ws.mkdir()
            httpsfake.write_probes(ws)
            (ws / "sgnode.js").write_text(NODE)
            fake = httpsfake.start(w, "registry.test", REGISTRY, module=registryfake.__name__)
            policy = base / "policy.yaml"
            policy.write_text(POLICY)
            yield Lab(w, base, ws, policy, fake)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("path", ["explicit", "transparent"])
def test_parallel_kept_alive_connections_to_an_inspected_registry_all_finish(lab: Lab, path: str) -> None:
    mark = lab.fake.mark()
    audit = lab.base / f"audit-{time.monotonic_ns()}.jsonl"
    home = lab.base / f"home-{path}"
    home.mkdir()
    sg = Sandgate(lab.world, policy=lab.policy, audit=audit, quiet=True, cwd=lab.ws, timeout=120)
    cmd = [sys.executable, "-c", "from sgprobe import *\n" + textwrap.dedent(SCRIPT)]
    r = sg.run(
        "--upstream-ca", str(lab.world.ca_pem),
        cmd=cmd if path == "explicit" else [*NO_PROXY, *cmd],
        env={**env(), "HOME": str(home)},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    res = httpsfake.results(r.stdout)
    py = {f"py.{w}.{i}": str(SIZES[(w + i) % len(SIZES)]) for w in range(WORKERS) for i in range(EACH)}
    node = {f"node.{i}": str(SIZES[i % len(SIZES)]) for i in range(40)}
    stalled = {k: res.get(k) for k, n in {**py, **node}.items() if k not in res or res[k]["body"] != n}
    assert not stalled, stalled  # every response whole (before the fix: the 6th of each connection timed out)
    assert all(res[k]["status"] == 200 for k in {**py, **node}), res
    seen = lab.fake.since(mark)
    assert len(seen) == len(py) + len(node)  # each request reached the registry once
    # The upstream connections were reused: one per client connection (before: one per request).
    assert len({s["conn"] for s in seen}) <= WORKERS + 4, sorted({s["conn"] for s in seen})
    records = [x for x in read_records(audit) if x["event"] == "request" and x["host"] == "registry.test"]
    assert len(records) == len(seen) and all(x["action"] == "allow" and x["status"] == 200 for x in records)
    assert {x["kind"] for x in records} == ({"connect", "tls"} if path == "explicit" else {"tls"})

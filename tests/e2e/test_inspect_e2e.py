"""Issue 13, end to end: TLS inspection per host, per-request rules, the sandbox's trust in the run CA.

Real `sandgate run` in a World, the daemon trusting the fake upstreams through `--upstream-ca`
(the world's test CA). The fakes (tests/support/httpsfake.py, gitfake.py) log every request they
receive: a refused request is judged by the client's 403 *and* by the fake never seeing it, next
to an allowed request in the same run that shows the path works. Every client runs twice: with
HTTPS_PROXY set (CONNECT through the explicit proxy) and without it (the transparent path).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support import gitfake, httpsfake
from ..support.caoracle import CA_VARIABLES
from ..support.httpsfake import Fake, Result
from ..support.runner import Sandgate, env
from ..support.spellings import ISSUE_SPELLINGS, OVERRIDES
from ..support.world import World, new_world

GIT, API, LOGQ, PASS = "198.51.100.71", "198.51.100.72", "198.51.100.73", "198.51.100.74"
POLICY = textwrap.dedent("""\
    version: 1
    network:
      allow:
        - host: git.test
          http:
            - read-only
            - methods: [POST]
              paths: ["/*/*/git-upload-pack"]
        - host: api.test
          http:
            - read-only
            - methods: [POST]
              paths: ["/v1/allowed/**"]
        - host: logq.test
          inspect: true
          log_query: true
        - pass.test
    """)
#: Where each rule of POLICY starts (FILE:LINE in 403 bodies and audit records).
GIT_RULE, API_RULE = 4, 9
NO_PROXY = ["env", "-u", "HTTPS_PROXY", "-u", "https_proxy", "-u", "ALL_PROXY", "-u", "all_proxy"]
PATHS = ("explicit", "transparent")
GIT_ID = {k: v for k, v in gitfake.GIT_ENV.items() if k != "HOME"}
CA_VARS = tuple(sorted(CA_VARIABLES))  # the issue's list (tests/support/caoracle.py)
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass
class Lab:
    world: World
    base: Path
    ws: Path  # the sandbox's cwd: probes, a copy of the (public) test CA certificate
    home: Path
    policy: Path
    upstream_ca: Path
    git_root: Path
    fakes: dict[str, Fake]

    def run(
        self, script: str, path: str = "explicit", timeout: float = 90, policy: Path | None = None
    ) -> tuple[dict[str, Result], Path]:
        """`script` (Python, `from sgprobe import *` done) in one sandbox; its probe results and audit log."""
        audit = self.base / f"audit-{time.monotonic_ns()}.jsonl"
        sg = Sandgate(self.world, policy=policy or self.policy, audit=audit, quiet=True, cwd=self.ws, timeout=timeout)
        cmd = [sys.executable, "-c", "from sgprobe import *\n" + textwrap.dedent(script)]
        r = sg.run(
            "--upstream-ca",
            str(self.upstream_ca),
            cmd=cmd if path == "explicit" else [*NO_PROXY, *cmd],
            env={**env(), **GIT_ID, "HOME": str(self.home)},
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return httpsfake.results(r.stdout), audit

    def seen(self, fake: str, mark: int) -> list[tuple[str, str]]:
        return [(s["method"], s["target"]) for s in self.fakes[fake].since(mark)]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-inspect-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        with new_world() as w:
            ws, home = base / "ws", base / "home"
            ws.mkdir()
            home.mkdir()
            httpsfake.write_probes(ws)
            shutil.copy(w.ca_pem, ws / "test-ca.pem")
            git_root = gitfake.bare_repo(w.tmp / "git")
            fakes = {
                "git": gitfake.start(w, "git.test", GIT, git_root),
                "api": httpsfake.start(w, "api.test", API),
                "logq": httpsfake.start(w, "logq.test", LOGQ),
                "pass": httpsfake.start(w, "pass.test", PASS),
            }
            policy = base / "policy.yaml"
            policy.write_text(POLICY)
            yield Lab(w, base, ws, home, policy, w.ca_pem, git_root, fakes)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


def refused(r: Result, method: str, path: str) -> bool:
    """A 403 from sandgate naming the request and the rule that decides the host."""
    body = r["body"]
    named = "(rule " in body and ".yaml:" in body
    return r["status"] == 403 and body.startswith("sandgate: ") and f"{method} {path}" in body and named


def records(audit: Path) -> list[Any]:
    """The run's audit records (the one reader; a malformed line fails the test)."""
    return list(read_records(audit))


def requests_of(audit: Path, host: str) -> list[Any]:
    return [x for x in records(audit) if x["event"] == "request" and x["host"] == host]


def took(audit: Path, host: str, path: str, node: bool = False) -> None:
    """The requests really went the way the test meant: CONNECT through the explicit proxy, or the
    transparent path (kind "tls"); Node's clients ignore HTTPS_PROXY, so they are transparent in both."""
    kinds = {x["kind"] for x in requests_of(audit, host)}
    want = {"connect", "tls"} if node else {"connect"}
    assert kinds == (want if path == "explicit" else {"tls"}), kinds


# ---- request rules, by every client -------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_request_rules_with_curl_requests_urllib_and_node(lab: Lab, path: str) -> None:
    mark = lab.fakes["api"].mark()
    tag = path[0]
    script = f"""
        for tool in ("curl", "requests", "urllib"):
            base = "https://api.test/v1"
            t = tool + "-{tag}"
            calls = [("get", "GET", f"{{base}}/items/{{t}}?q=1", None),
                     ("post", "POST", f"{{base}}/allowed/{{t}}", b"payload"),
                     ("put", "PUT", f"{{base}}/items/{{t}}", b"payload"),
                     ("post-other", "POST", f"{{base}}/other/{{t}}", b"payload")]
            for name, method, url, data in calls:
                if tool == "curl":
                    curl(f"{{tool}}.{{name}}", "-X", method, *(["--data-binary", data.decode()] if data else []), url)
                elif tool == "requests":
                    with_requests(f"{{tool}}.{{name}}", method, url, data=data)
                else:
                    with_urllib(f"{{tool}}.{{name}}", method, url, data=data)
        for mode in ("https", "fetch"):
            t = "node" + mode + "-{tag}"
            node(mode, mode, [["get", "GET", f"https://api.test/v1/items/{{t}}?q=1", None],
                              ["post", "POST", f"https://api.test/v1/allowed/{{t}}", "payload"],
                              ["put", "PUT", f"https://api.test/v1/items/{{t}}", "payload"],
                              ["post-other", "POST", f"https://api.test/v1/other/{{t}}", "payload"]])
        """
    res, audit = lab.run(script, path)
    tools = ("curl", "requests", "urllib", "https", "fetch")
    for tool in tools:
        t = f"node{tool}-{tag}" if tool in ("https", "fetch") else f"{tool}-{tag}"
        assert res[f"{tool}.get"]["status"] == 200, res[f"{tool}.get"]
        assert res[f"{tool}.get"]["body"] == f"hello from api.test GET /v1/items/{t}\n"
        assert res[f"{tool}.post"]["status"] == 200, res[f"{tool}.post"]
        assert refused(res[f"{tool}.put"], "PUT", f"/v1/items/{t}"), res[f"{tool}.put"]
        assert refused(res[f"{tool}.post-other"], "POST", f"/v1/other/{t}"), res[f"{tool}.post-other"]
    seen = lab.seen("api", mark)
    want = []
    for tool in tools:
        t = f"node{tool}-{tag}" if tool in ("https", "fetch") else f"{tool}-{tag}"
        want += [("GET", f"/v1/items/{t}?q=1"), ("POST", f"/v1/allowed/{t}")]
    assert sorted(seen) == sorted(want)  # the refused ones never reached the upstream
    posted = [s for s in lab.fakes["api"].since(mark) if s["method"] == "POST"]
    assert all(s["body"] == len(b"payload") for s in posted), posted
    denies = [x for x in requests_of(audit, "api.test") if x["action"] == "deny"]
    assert len(denies) == 2 * len(tools), denies
    took(audit, "api.test", path, node=True)


@pytest.mark.parametrize("path", PATHS)
def test_git_clone_and_fetch_pass_push_is_refused(lab: Lab, path: str) -> None:
    repo = lab.git_root / "o/r.git"
    before = gitfake.refs(repo)
    mark = lab.fakes["git"].mark()
    script = f"""
        d = "/tmp/clone-{path}"
        sh("clone", f"git clone -q https://git.test/o/r.git {{d}} && cat {{d}}/README")
        sh("fetch", f"git -C {{d}} fetch -q origin && git -C {{d}} rev-parse origin/main")
        sh("commit", f"cd {{d}} && echo change > f && git add f && git commit -qm change")
        sh("push", f"git -C {{d}} push origin main")
        sh("push-h1", f"git -C {{d}} -c http.version=HTTP/1.1 push origin main")
        """
    res, audit = lab.run(script, path)
    assert res["clone"]["status"] == 0 and res["clone"]["body"] == "hello\n", res["clone"]
    assert res["fetch"]["status"] == 0 and res["fetch"]["body"].strip() == before.split()[1], res["fetch"]
    assert res["commit"]["status"] == 0, res["commit"]
    for push in ("push", "push-h1"):
        assert res[push]["status"] != 0 and "403" in res[push]["error"], res[push]
    assert gitfake.refs(repo) == before  # the fake's repository is unchanged
    seen = lab.seen("git", mark)
    assert ("POST", "/o/r.git/git-upload-pack") in seen  # clone and fetch really went to the fake
    assert not [s for s in seen if s[0] == "POST" and "receive-pack" in s[1]], seen
    denied = [x for x in requests_of(audit, "git.test") if x["action"] == "deny"]
    assert {(x["method"], x["path"]) for x in denied} == {("POST", "/o/r.git/git-receive-pack")}, denied
    assert len(denied) == 2
    took(audit, "git.test", path)


def test_git_push_passes_where_the_rules_allow_it(lab: Lab) -> None:
    """The control for the refused push: through the same daemon, an inspected git.test without rules takes it."""
    repo = lab.git_root / "o/r.git"
    before = gitfake.refs(repo)
    open_policy = lab.base / "open.yaml"
    open_policy.write_text("version: 1\nnetwork:\n  allow:\n    - host: git.test\n      inspect: true\n")
    script = """
        d = "/tmp/clone-open"
        sh("push", f"git clone -q https://git.test/o/r.git {d} && cd {d} && echo pushed > f && git add f"
                   " && git commit -qm pushed && git push -q origin main:refs/heads/pushed")
        """
    res, audit = lab.run(script, policy=open_policy)
    assert res["push"]["status"] == 0, res["push"]
    after = gitfake.refs(repo)
    assert after != before and "refs/heads/pushed" in after and before in after
    assert ("POST", "/o/r.git/git-receive-pack") in [(x["method"], x["path"]) for x in requests_of(audit, "git.test")]


@pytest.mark.parametrize("path", PATHS)
def test_one_kept_alive_connection_is_judged_per_request(lab: Lab, path: str) -> None:
    mark = lab.fakes["api"].mark()
    t = f"ka-{path}"
    u = "https://api.test/v1"
    # h2 first: once the run's proxy saw this HTTP/1.1 upstream answer, a client offering both gets HTTP/1.1
    # from it as from the upstream itself (netguard.decision.tlsinspect); the h2 path is judged per request too.
    script = f"""
        curl("h2", "--http2", "{u}/{t}/h2/1", "--next", "--http2", "-X", "PUT", "-d", "x", "{u}/{t}/h2/2",
             "--next", "--http2", "{u}/{t}/h2/3")
        keepalive("py", "api.test", [("GET", "/v1/{t}/1"), ("DELETE", "/v1/{t}/2"), ("GET", "/v1/{t}/3")])
        curl("h1", "--http1.1", "{u}/{t}/h1/1", "--next", "--http1.1", "-X", "DELETE", "{u}/{t}/h1/2",
             "--next", "--http1.1", "{u}/{t}/h1/3")
        """
    res, audit = lab.run(script, path)
    took(audit, "api.test", path)
    assert [res[f"py.{i}"]["status"] for i in range(3)] == [200, 403, 200], res
    assert len({res[f"py.{i}.sock"]["body"] for i in range(3)}) == 1, res  # one socket for all three
    assert refused(res["py.1"], "DELETE", f"/v1/{t}/2")
    for proto, version in (("h1", "1.1"), ("h2", "2")):
        got = [res[f"{proto}.{i}"] for i in range(3)]
        assert [r["status"] for r in got] == [200, 403, 200], got
        assert [r["connects"] for r in got] == [1, 0, 0], got
        assert {r["version"] for r in got} == {version}, got
        assert refused(got[1], "DELETE" if proto == "h1" else "PUT", f"/v1/{t}/{proto}/2"), got[1]
    seen = lab.seen("api", mark)
    assert sorted(seen) == sorted(
        [("GET", f"/v1/{t}/{n}") for n in (1, 3)] + [("GET", f"/v1/{t}/{p}/{n}") for p in ("h1", "h2") for n in (1, 3)]
    )


def test_a_hostile_sandbox_pipelining_refusals_beside_an_honest_one(lab: Lab) -> None:
    """Two sandboxes of one daemon at once, both inspecting api.test: one pipelines 2,000 refused DELETEs on
    one connection (the front door answers each without mitmproxy), the other makes kept-alive GETs. The
    honest one gets every answer; the hostile one only 403s; the fake never sees a DELETE."""
    import threading

    mark = lab.fakes["api"].mark()
    hostile = """
        keepalive("warm", "api.test", [("GET", "/v1/hostile/warm")])  # the run learns api.test speaks HTTP/1.1:
        c = connection("api.test")  # so the front door itself takes this CONNECT (tlshttp.takes)
        c.connect()
        n = 2000
        c.sock.sendall(b"DELETE /v1/hostile/x HTTP/1.1\\r\\nHost: api.test\\r\\n\\r\\n" * n)
        got = b""
        while got.count(b"HTTP/1.1 403 ") < n:
            data = c.sock.recv(1 << 20)
            if not data:
                break
            got += data
        emit("hostile", status=got.count(b"HTTP/1.1 403 "), body=str(got.count(b"HTTP/1.1 200 ")))
        """
    honest = 'keepalive("honest", "api.test", [("GET", f"/v1/honest/{i}") for i in range(40)])'
    out: dict[str, dict[str, Result]] = {}

    def run(name: str, script: str) -> None:
        out[name] = lab.run(script)[0]

    threads = [threading.Thread(target=run, args=a) for a in (("hostile", hostile), ("honest", honest))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out["hostile"]["hostile"]["status"] == 2000 and out["hostile"]["hostile"]["body"] == "0", out["hostile"]
    assert [out["honest"][f"honest.{i}"]["status"] for i in range(40)] == [200] * 40, out["honest"]
    seen = lab.seen("api", mark)
    want = [("GET", "/v1/hostile/warm"), *(("GET", f"/v1/honest/{i}") for i in range(40))]
    assert sorted(seen) == sorted(want), seen[:5]


def test_refusals_of_unknown_length_are_a_403(lab: Lab) -> None:
    mark = lab.fakes["api"].mark()
    res, _ = lab.run("""
        curl("get", "--http2", "https://api.test/v1/unknown/get")
        node("node", "https-chunked", [["post", "POST", "https://api.test/v1/allowed/chunked", "payload"],
                                       ["put", "PUT", "https://api.test/v1/unknown/chunked", "payload"]])
        curl("chunked", "--http1.1", "-X", "PUT", "-H", "Transfer-Encoding: chunked", "-d", "x",
             "https://api.test/v1/unknown/curl-chunked")
        curl("delete", "--http2", "-X", "DELETE", "https://api.test/v1/unknown/delete")
        sh("mk", "head -c 3000000 /dev/zero > big.bin")
        curl("huge", "--http1.1", "-X", "PUT", "-H", "Transfer-Encoding: chunked", "--data-binary", "@big.bin",
             "https://api.test/v1/unknown/huge")
        curl("after", "--http2", "https://api.test/v1/unknown/after")
        """)
    assert res["get"]["status"] == 200 and res["get"]["version"] == "2", res["get"]
    assert res["node.post"]["status"] == 200, res["node.post"]  # a chunked body that is allowed goes through
    assert lab.seen("api", mark)[:2] == [("GET", "/v1/unknown/get"), ("POST", "/v1/allowed/chunked")]
    assert len(lab.seen("api", mark)) == 3  # and the last request after the refusals: nothing refused got through
    assert refused(res["node.put"], "PUT", "/v1/unknown/chunked"), res["node.put"]
    assert refused(res["chunked"], "PUT", "/v1/unknown/curl-chunked"), res["chunked"]
    assert refused(res["delete"], "DELETE", "/v1/unknown/delete"), res["delete"]
    # Past what the proxy holds for a 403 (1 MiB), an unknown-length body ends its connection instead;
    # the upstream still never saw it, and the daemon serves the next request.
    assert res["huge"]["status"] in (0, 403) and res["after"]["status"] == 200, (res["huge"], res["after"])
    assert lab.seen("api", mark)[-1] == ("GET", "/v1/unknown/after")


def test_path_and_method_tricks_are_refused(lab: Lab) -> None:
    mark = lab.fakes["git"].mark()
    tricks = {
        "dots": "/o/r/git-upload-pack/../../x/y/git-receive-pack",
        "escaped": "/o/r/git-upload-pack/%2e%2e/%2e%2e/x/y/git-receive-pack",
        "escaped-upper": "/o/r/git-upload-pack/%2E%2E/%2E%2E/x/y/git-receive-pack",
        "backslash": "/o/r.git/git-upload-pack\\..\\git-receive-pack",  # some servers read '\\' as '/'
        "query": "/o/r.git/git-receive-pack?/o/r.git/git-upload-pack",  # a matcher on the whole target
    }
    lines = []
    for proto in ("--http1.1", "--http2"):
        for name, target in tricks.items():
            url = "https://git.test" + target
            lines.append(f"curl({name + proto!r}, {proto!r}, '--path-as-is', '-X', 'POST', '-d', 'x', {url!r})")
        url = "https://git.test/o/r.git/git-upload-pack"
        lines.append(f"curl({'allowed' + proto!r}, {proto!r}, '-X', 'POST', '-d', 'x', {url!r})")
    lines.append('curl("lower", "--http1.1", "-X", "post", "-d", "x", "https://git.test/o/r.git/git-upload-pack")')
    lines.append('curl("lower-get", "--http1.1", "-X", "get", "https://git.test/o/r.git/info/refs")')
    res, audit = lab.run("\n".join(lines))
    for proto in ("--http1.1", "--http2"):
        for name in tricks:
            r = res[f"{name}{proto}"]
            assert r["status"] == 403 and "sandgate" in r["body"], (name, proto, r)
        # The control: the allowed POST reaches git-http-backend (which answers it, whatever it thinks of "x").
        assert res[f"allowed{proto}"]["status"] not in (0, 403), res[f"allowed{proto}"]
    assert res["lower"]["status"] == 403 and "post" in res["lower"]["body"], res["lower"]
    assert res["lower-get"]["status"] == 403, res["lower-get"]  # methods are exact: `get` is not GET
    seen = lab.seen("git", mark)
    assert seen == [("POST", "/o/r.git/git-upload-pack")] * 2, seen  # only the two allowed POSTs arrived
    denies = [x for x in requests_of(audit, "git.test") if x["action"] == "deny"]
    assert len(denies) == 2 * len(tricks) + 2, denies


#: Issue 24: `GET /v1/**` (and POST), one rule that lets its paths upgrade to WebSocket.
V1_POLICY = textwrap.dedent("""\
    version: 1
    network:
      allow:
        - host: api.test
          http:
            - methods: [GET, POST]
              paths: ["/v1/**"]
            - methods: [GET]
              paths: ["/v1/ws/**"]
              websocket: true
    """)
#: The review's: each reached the upstream under `GET /v1/**`; then dots padded with blanks, and
#: override headers in the spellings CGI/PHP/WSGI and auth subrequests read (the second review).
SPELLINGS = (*ISSUE_SPELLINGS, "/v1/..%C2%A0/admin", "/v1/.%E2%80%8B./admin")
OVERRIDE_SPELLINGS = (*OVERRIDES, "X_HTTP_METHOD_OVERRIDE", "X-Original-Method")
WS_HEADERS = ["-H", "Connection: Upgrade", "-H", "Upgrade: websocket", "-H", "Sec-WebSocket-Version: 13",
              "-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]  # fmt: skip


def test_ambiguous_paths_overrides_and_upgrades_never_reach_the_upstream(lab: Lab) -> None:
    """Refused by the real daemon, judged by the fake upstream's log: none arrived, the controls did."""
    policy = lab.base / "v1.yaml"
    policy.write_text(V1_POLICY)
    mark = lab.fakes["api"].mark()
    lines = []
    for proto in ("--http1.1", "--http2"):
        for i, target in enumerate(SPELLINGS):
            lines.append(f"curl({f'path{i}{proto}'!r}, {proto!r}, '--path-as-is', {'https://api.test' + target!r})")
        lines.append(f"curl({'ok' + proto!r}, {proto!r}, 'https://api.test/v1/ok')")
    for i, header in enumerate(OVERRIDE_SPELLINGS):
        args = ["-X", "POST", "-d", "x", "-H", f"{header}: DELETE", f"https://api.test/v1/override/{i}"]
        lines.append(f"curl({f'override{i}'!r}, *{args!r})")
    lines.append("curl('dot-method', '-X', 'POST', '-d', 'x', 'https://api.test/v1/q?.method=DELETE')")  # PHP: _method
    lines.append(f"curl('ws-h2c', '--http1.1', *{WS_HEADERS!r}, '-H', 'Upgrade: h2c', 'https://api.test/v1/ws/two')")
    lines.append("curl('post', '-X', 'POST', '-d', 'x', 'https://api.test/v1/ok-post')")
    lines.append(f"curl('ws-refused', '--http1.1', *{WS_HEADERS!r}, 'https://api.test/v1/chat')")
    lines.append(
        "curl('h2c', '--http1.1', '-H', 'Upgrade: h2c', '-H', 'Connection: Upgrade', 'https://api.test/v1/ws/h2c')"
    )
    lines.append(f"curl('ws-allowed', '--http1.1', *{WS_HEADERS!r}, 'https://api.test/v1/ws/chat')")
    res, audit = lab.run("\n".join(lines), policy=policy)
    refused_names = [f"path{i}{p}" for p in ("--http1.1", "--http2") for i in range(len(SPELLINGS))]
    refused_names += [f"override{i}" for i in range(len(OVERRIDE_SPELLINGS))] + ["ws-refused", "h2c"]
    refused_names += ["dot-method", "ws-h2c"]
    for name in refused_names:
        r = res[name]
        assert r["status"] == 403 and r["body"].startswith("sandgate: request refused: "), (name, r)
    for name in ("ok--http1.1", "ok--http2", "post", "ws-allowed"):
        assert res[name]["status"] == 200 and "hello from api.test" in res[name]["body"], (name, res[name])
    seen = lab.fakes["api"].since(mark)
    got = sorted((s["method"], s["target"]) for s in seen)
    assert got == sorted([("GET", "/v1/ok"), ("GET", "/v1/ok"), ("POST", "/v1/ok-post"), ("GET", "/v1/ws/chat")])
    overrides = {o.replace("_", "-").lower() for o in OVERRIDE_SPELLINGS}
    assert not [s for s in seen if any(k.replace("_", "-").lower() in overrides for k, _ in s["headers"])]
    denies = [x for x in requests_of(audit, "api.test") if x["action"] == "deny"]
    assert len(denies) == len(refused_names), denies
    whys = " | ".join(x["reason"] for x in denies).lower()  # HTTP/2 sends header names in lower case
    for reason in ("path is not canonical", "';' path parameter", "overlong UTF-8", "escaped '%'",
                   "method-override header (X-HTTP-Method-Override)", "a WebSocket upgrade of GET /v1/chat",
                   "an upgrade to 'h2c'", "also padded with blanks", "method-override header (X_HTTP_METHOD_OVERRIDE)",
                   "method-override header (X-Original-Method)", "'_method' query parameter",
                   "an upgrade to 'websocket, h2c'"):  # fmt: skip
        assert reason.lower() in whys, (reason, whys)


# ---- passthrough and trust ----------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_passthrough_hosts_show_their_own_certificate_inspected_ones_the_run_ca(lab: Lab, path: str) -> None:
    mark = lab.fakes["pass"].mark()
    script = """
        peer("pass", "pass.test")
        peer("api", "api.test")
        peer("pass-verified", "pass.test", context=ssl.create_default_context(cafile="test-ca.pem"))
        peer("api-test-ca", "api.test", context=ssl.create_default_context(cafile="test-ca.pem"))
        curl("pass-curl", "--cacert", "test-ca.pem", "https://pass.test/through")
        """
    res, audit = lab.run(script, path)
    passed = json.loads(res["pass"]["body"])
    assert passed["sha256"] == lab.fakes["pass"].fingerprint()  # the upstream's own certificate, untouched
    assert passed["issuer"] == lab.world.ca.subject
    assert res["pass-verified"]["status"] == 200, res["pass-verified"]
    assert res["pass-curl"]["body"] == "hello from pass.test GET /through\n", res["pass-curl"]
    api = json.loads(res["api"]["body"])
    assert api["sha256"] != lab.fakes["api"].fingerprint()
    assert api["issuer"] != lab.world.ca.subject  # issued by the run's CA, not the upstream's
    # The test CA does not vouch for what the sandbox sees of api.test: it is not the upstream talking.
    assert res["api-test-ca"]["status"] == 0 and "CERTIFICATE_VERIFY_FAILED" in res["api-test-ca"]["error"]
    assert lab.seen("pass", mark) == [("GET", "/through")]
    assert requests_of(audit, "pass.test") == []  # passthrough: no request is seen, none recorded


TRUST = """
    import ssl
    def only(cafile):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=cafile)
        return ctx
    def count(path):
        return open(path).read().count("BEGIN CERTIFICATE")
    for var in VARS:
        f = os.environ.get(var)
        emit("var." + var, status=200 if f else 0, body=str(f), count=count(f) if f else 0)
        if f:
            peer("only." + var, "api.test", context=only(f))
    emit("bundle", status=200, body="", count=count(SYSTEM))
    peer("only.system", "api.test", context=only(SYSTEM))
    peer("certifi", "api.test", context=only(__import__("certifi").where()))
    # Tools with their default settings: every variable gone, the system bundle path only.
    bare = {k: v for k, v in os.environ.items() if k not in VARS}
    sh("curl-system", "curl -sS https://api.test/sys/curl", env=bare)
    sh("python-system", "python3 -c 'import urllib.request as u; print(u.urlopen(\\"https://api.test/sys/py\\").read().decode())'", env=bare)
    sh("git-system", "git ls-remote https://git.test/o/r.git", env=bare)
    # ... and with what the sandbox sets.
    curl("curl", "https://api.test/env/curl")
    peer("ssl-default-peer", "api.test", context=ssl.create_default_context())
    with_requests("requests", "GET", "https://api.test/env/requests")
    with_urllib("urllib", "GET", "https://api.test/env/urllib")
    node("node", "https", [["get", "GET", "https://api.test/env/node", None]])
    node("fetch", "fetch", [["get", "GET", "https://api.test/env/fetch", None]])
    sh("git", "git ls-remote https://git.test/o/r.git")
    """


@pytest.mark.parametrize("path", PATHS)
def test_the_sandbox_trusts_the_run_ca_through_every_channel(lab: Lab, path: str) -> None:
    script = f"VARS = {CA_VARS!r}\nSYSTEM = {SYSTEM_BUNDLE!r}\n" + textwrap.dedent(TRUST)
    res, _ = lab.run(script, path)
    host_roots = Path(SYSTEM_BUNDLE).read_text().count("BEGIN CERTIFICATE")
    for var in CA_VARS:
        assert res[f"var.{var}"]["status"] == 200, f"{var} is not set inside"
        assert res[f"var.{var}"]["count"] > host_roots, var  # combined: run CA + system roots
        assert res[f"only.{var}"]["status"] == 200, (var, res[f"only.{var}"])
    assert res["bundle"]["count"] > host_roots
    assert res["only.system"]["status"] == 200, res["only.system"]
    assert res["certifi"]["status"] == 0 and "CERTIFICATE_VERIFY_FAILED" in res["certifi"]["error"]  # control
    assert res["curl-system"]["body"] == "hello from api.test GET /sys/curl\n", res["curl-system"]
    assert res["python-system"]["body"].strip() == "hello from api.test GET /sys/py", res["python-system"]
    assert res["git-system"]["status"] == 0 and "refs/heads/main" in res["git-system"]["body"], res["git-system"]
    assert res["curl"]["body"] == "hello from api.test GET /env/curl\n", res["curl"]
    assert res["ssl-default-peer"]["status"] == 200, res["ssl-default-peer"]
    for tool in ("requests", "urllib", "node.get", "fetch.get"):
        assert res[tool]["status"] == 200, (tool, res[tool])
    assert res["git"]["status"] == 0 and "refs/heads/main" in res["git"]["body"], res["git"]
    # Host side: the system bundle itself was never touched (the combined one is mounted inside only).
    assert Path(SYSTEM_BUNDLE).read_text().count("BEGIN CERTIFICATE") == host_roots


def test_the_run_ca_key_is_not_readable_inside(lab: Lab) -> None:
    """No private key readable anywhere a process inside looks belongs to the CA that signs its leaves."""
    script = """
        import re
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        c = connection("api.test"); c.connect()
        leaf = x509.load_der_x509_certificate(c.sock.getpeercert(binary_form=True))
        pems = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", open(os.environ["SSL_CERT_FILE"], "rb").read(), re.S)
        roots = [x509.load_pem_x509_certificate(b) for b in pems]
        ca = [r for r in roots if r.subject == leaf.issuer]
        pub = ca[0].public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        found, keys = [], 0
        for top in ("/tmp", "/run", "/etc", os.environ["HOME"], os.getcwd()):
            for dirpath, dirs, files in os.walk(top):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        data = open(p, "rb").read(1 << 20)
                    except OSError:
                        continue
                    if b"PRIVATE KEY" in data:
                        keys += 1
                        try:
                            k = serialization.load_pem_private_key(data[data.index(b"-----BEGIN"):], None)
                        except Exception:
                            continue
                        if k.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == pub:
                            found.append(p)
        emit("ca", status=200 if ca else 0, body=ca[0].subject.rfc4514_string() if ca else "")
        emit("scan", status=200, body=json.dumps(found), keys=keys)
        """
    res, _ = lab.run(script)
    assert res["ca"]["status"] == 200, res  # the run CA is in the bundle inside: the scan knows what to look for
    assert json.loads(res["scan"]["body"]) == [], res["scan"]


# ---- audit --------------------------------------------------------------------------------------


def test_every_inspected_request_is_one_audit_record(lab: Lab) -> None:
    script = """
        curl("get", "https://api.test/v1/items/audit?secret-query=1")
        curl("big", "https://api.test/bytes/5000?q=2")
        curl("post", "-X", "POST", "--data-binary", "0123456789", "https://api.test/v1/allowed/audit")
        curl("deny", "-X", "PUT", "-d", "x", "https://api.test/v1/items/audit?q=3")
        curl("logq", "https://logq.test/search?q=kept")
        curl("logq-post", "-X", "PATCH", "https://logq.test/any/thing?x=1")
        """
    res, audit = lab.run(script)
    assert [res[n]["status"] for n in ("get", "big", "post", "deny", "logq", "logq-post")] == [
        200,
        200,
        200,
        403,
        200,
        200,
    ]
    api = requests_of(audit, "api.test")
    assert [(x["method"], x["path"], x["action"]) for x in api] == [
        ("GET", "/v1/items/audit", "allow"),
        ("GET", "/bytes/5000", "allow"),
        ("POST", "/v1/allowed/audit", "allow"),
        ("PUT", "/v1/items/audit", "deny"),
    ]
    assert "secret-query" not in audit.read_text()  # no query string unless the policy asks
    assert [x["status"] for x in api] == [200, 200, 200, 403]
    assert bytes_down(api[1]) >= 5000 and bytes_down(api[0]) > 0
    assert bytes_up(api[2]) >= 10
    assert api[0]["rule"] == f"{lab.policy}:{API_RULE + 2}"  # the read-only rule
    assert api[2]["rule"] == f"{lab.policy}:{API_RULE + 3}"  # the POST rule
    deny = api[3]
    assert deny["rule"] == f"{lab.policy}:{API_RULE}"  # the inspecting entry that leaves PUT out
    assert res["deny"]["body"].rstrip().endswith(f"(rule {lab.policy}:{API_RULE})"), res["deny"]
    assert "PUT" in deny["reason"] and "/v1/items/audit" in deny["reason"]
    logq = requests_of(audit, "logq.test")
    assert [(x["method"], x["path"], x["status"]) for x in logq] == [
        ("GET", "/search?q=kept", 200),
        ("PATCH", "/any/thing?x=1", 200),
    ]
    assert all(x["action"] == "allow" for x in logq)


def bytes_down(rec: Any) -> int:
    return int(rec.get("bytes_down", rec.get("bytes", 0)))


def bytes_up(rec: Any) -> int:
    return int(rec.get("bytes_up", 0))


def test_helpers_are_real() -> None:
    """The 403 judge refuses a plain 403 from an upstream and a sandgate 403 about another request."""
    r = Result(name="x", status=403, body="sandgate: request refused: DELETE /a on h: no (rule p.yaml:9)\n", error="")
    assert refused(r, "DELETE", "/a")
    assert not refused(Result(name="x", status=403, body="status 403 from api.test", error=""), "DELETE", "/a")
    assert not refused(r, "DELETE", "/b")

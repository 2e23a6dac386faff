"""Issue 13, end to end: credential brokering. The secret reaches only the bound fake upstream, and
nothing inside the sandbox can read it.

The launcher's environment holds the real value; inside, the variable holds a sentinel. The fakes
(tests/support/httpsfake.py) log every header they receive, so "the upstream got the real value"
and "the other host saw nothing" are the upstreams' own evidence. The fakes' logs live under the
world's tmp directory, which is under the host's /tmp: the sandbox has a /tmp of its own.
"""

from __future__ import annotations

import json
import os
import re
import secrets
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

from ..support import httpsfake
from ..support.httpsfake import Fake, Result, header
from ..support.runner import REPO, Sandgate, env
from ..support.world import World, new_world

API, OTHER, FILES = "198.51.100.81", "198.51.100.82", "198.51.100.83"
#: Marks the real values; never sent into the sandbox. The scan inside looks for it (spelled in two
#: halves there, so the scanner's own source and command line do not carry it).
MARK = "q7realsecret"
REAL = f"sk-{MARK}-{secrets.token_hex(16)}"
FILE_REAL = f"{MARK}-file-{secrets.token_hex(16)}"
TOKEN_FILE = ".config/sgtest/token"  # under the fake home; `file:` source of the second credential
POLICY = (
    textwrap.dedent("""\
    version: 1
    network:
      allow:
        - api.test
        - host: other.test
          inspect: true
        - files.test
      credentials:
        - host: api.test
          header: Authorization
          value: "Bearer ${SANDGATE_TEST_KEY}"
        - host: files.test
          header: X-Api-Key
          value: "${SANDGATE_FILE_KEY}"
          file: ~/%s
    """)
    % TOKEN_FILE
)
NO_PROXY = ["env", "-u", "HTTPS_PROXY", "-u", "https_proxy", "-u", "ALL_PROXY", "-u", "all_proxy"]
NO_PROXY += ["-u", "HTTP_PROXY", "-u", "http_proxy"]
PATHS = ("explicit", "transparent")


@dataclass
class Lab:
    world: World
    base: Path
    ws: Path
    home: Path
    policy: Path
    fakes: dict[str, Fake]

    def run(
        self, script: str, path: str = "explicit", timeout: float = 90, key: str = REAL
    ) -> tuple[dict[str, Result], Path, str]:
        """`script` (Python, `from sgprobe import *` done) in one sandbox: probe results, audit log, stderr;
        `key`: the secret in the launcher's $SANDGATE_TEST_KEY."""
        audit = self.base / f"audit-{time.monotonic_ns()}.jsonl"
        sg = Sandgate(self.world, policy=self.policy, audit=audit, quiet=True, cwd=self.ws, timeout=timeout)
        cmd = [sys.executable, "-c", "from sgprobe import *\n" + textwrap.dedent(script)]
        r = sg.run(
            "--upstream-ca",
            str(self.world.ca_pem),
            cmd=cmd if path == "explicit" else [*NO_PROXY, *cmd],
            env={**env(), "HOME": str(self.home), "SANDGATE_TEST_KEY": key},
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert key not in r.stdout + r.stderr and FILE_REAL not in r.stdout + r.stderr
        return httpsfake.results(r.stdout), audit, r.stderr

    def marks(self) -> dict[str, int]:
        return {k: f.mark() for k, f in self.fakes.items()}

    def since(self, marks: dict[str, int], name: str) -> list[httpsfake.Seen]:
        return self.fakes[name].since(marks[name])


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="sandgate-creds-", dir="/var/tmp"))  # the sandbox's /tmp is its own
    try:
        with new_world() as w:
            ws, home = base / "ws", base / "home"
            ws.mkdir()
            (home / TOKEN_FILE).parent.mkdir(parents=True)
            (home / TOKEN_FILE).write_text(FILE_REAL + "\n")
            httpsfake.write_probes(ws)
            fakes = {
                "api": httpsfake.start(w, "api.test", API),
                "api80": httpsfake.start(w, "api.test", API, 80, plain=True),
                "other": httpsfake.start(w, "other.test", OTHER),
                "other80": httpsfake.start(w, "other.test", OTHER, 80, plain=True),
                "files": httpsfake.start(w, "files.test", FILES),
            }
            policy = base / "policy.yaml"
            policy.write_text(POLICY)
            yield Lab(w, base, ws, home, policy, fakes)
    finally:
        from fsguard import homeoverlay

        homeoverlay.forget_under(os.getuid(), str(base))
        shutil.rmtree(base, ignore_errors=True)


def leaked(seen: list[httpsfake.Seen], *values: str) -> list[httpsfake.Seen]:
    """Requests that carried any of `values` anywhere (target or any header)."""
    return [s for s in seen if any(v in json.dumps([s["target"], s["headers"]]) for v in values)]


def records(audit: Path) -> list[Any]:
    """The run's audit records (the one reader; a malformed line fails the test)."""
    return list(read_records(audit))


def audit_text(audit: Path) -> str:
    return audit.read_text(encoding="utf-8")


# ---- the bound host gets the real value ---------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_the_bound_upstream_receives_the_real_value_for_the_sentinel(lab: Lab, path: str) -> None:
    marks = lab.marks()
    script = """
        key = os.environ.get("SANDGATE_TEST_KEY", "")
        emit("var", status=200, body=key)
        auth = {"Authorization": "Bearer " + key}
        curl("curl-sentinel", "-H", "Authorization: Bearer " + key, "https://api.test/c/curl-sentinel")
        curl("curl-none", "https://api.test/c/curl-none")
        with_requests("requests", "GET", "https://api.test/c/requests", headers=auth)
        with_urllib("urllib", "GET", "https://api.test/c/urllib")
        node("node", "https", [["get", "GET", "https://api.test/c/node-https", None]])
        node("fetch", "fetch", [["get", "GET", "https://api.test/c/node-fetch", None]])
        curl("h2", "--http2", "-H", "Authorization: Bearer " + key, "https://api.test/c/h2")
        curl("files", "https://files.test/c/files")
        curl("plain", "http://api.test/c/plain")  # plain HTTP: the proxy adds nothing
        emit("file-var", status=200, body=os.environ.get("SANDGATE_FILE_KEY", ""))
        """
    res, audit, _ = lab.run(script, path)
    sentinel = res["var"]["body"]
    assert sentinel and sentinel != REAL and MARK not in sentinel, sentinel
    assert sentinel.startswith("sk-")  # the vendor prefix is kept: SDK format checks still pass
    for name in ("curl-sentinel", "curl-none", "requests", "urllib", "node.get", "fetch.get", "h2", "files", "plain"):
        assert res[name]["status"] == 200, (name, res[name])
    got = {s["target"]: header(s, "authorization") for s in lab.since(marks, "api")}
    want = ["curl-sentinel", "curl-none", "requests", "urllib", "node-https", "node-fetch", "h2"]
    assert got == {f"/c/{n}": [f"Bearer {REAL}"] for n in want}  # one header, the real value, on every request
    files = lab.since(marks, "files")
    assert [header(s, "x-api-key") for s in files] == [[FILE_REAL]]
    assert not leaked(lab.since(marks, "files"), REAL) and not leaked(lab.since(marks, "api"), FILE_REAL)
    assert not leaked(lab.since(marks, "api") + files, sentinel)  # the sentinel never leaves the proxy
    assert res["file-var"]["body"] != FILE_REAL
    plain = lab.since(marks, "api80")
    assert [(s["target"], header(s, "authorization")) for s in plain] == [("/c/plain", [])]
    for name in ("other", "other80", "api80"):  # the secrets reached only their bound hosts
        assert not leaked(lab.since(marks, name), REAL, FILE_REAL, MARK), name
    text = audit_text(audit)
    assert REAL not in text and FILE_REAL not in text and MARK not in text
    reqs = [x for x in records(audit) if x["event"] == "request" and x["host"] == "api.test"]
    assert all(x["action"] == "allow" for x in reqs), reqs
    assert len([x for x in reqs if x["kind"] != "http"]) == len(want), reqs
    assert [x["path"] for x in reqs if x["kind"] == "http"] == ["/c/plain"], reqs


def test_a_non_vendor_secret_leaves_nothing_of_itself_in_the_sentinel(lab: Lab) -> None:
    """Issue 24: v2 kept a secret's first letters up to a '-' or '_' (`REALSECRET-sandgate-sentinel-...`)."""
    real = f"REALSECRET-{MARK}-{secrets.token_hex(16)}"
    marks = lab.marks()
    script = """
        key = os.environ.get("SANDGATE_TEST_KEY", "")
        emit("var", status=200, body=key)
        curl("bound", "-H", "Authorization: Bearer " + key, "https://api.test/c/non-vendor")
        """
    res, audit, _ = lab.run(script, key=real)
    sentinel = res["var"]["body"]
    assert re.fullmatch(r"sandgate-sentinel-[0-9a-f]{32}", sentinel), sentinel  # no prefix at all
    assert not sentinel.startswith(real[0]) and "REALSECRET" not in sentinel and MARK not in sentinel
    # The control: the sentinel still works, the bound host got the real value for it.
    assert res["bound"]["status"] == 200, res["bound"]
    assert [header(s, "authorization") for s in lab.since(marks, "api")] == [[f"Bearer {real}"]]
    assert real not in audit_text(audit)


def test_a_one_character_secret_is_refused_in_one_line_before_anything_runs(lab: Lab) -> None:
    """Issue 24: with `x` every request holding an x was an attempted leak and every x of a response masked."""
    marker = lab.ws / "ran-with-a-short-secret"
    sg = Sandgate(lab.world, policy=lab.policy, audit=lab.base / "short.jsonl", quiet=True, cwd=lab.ws, timeout=60)
    for short in ("x", "sk-fifteen-char"):
        r = sg.run(cmd=["touch", str(marker)], env={**env(), "HOME": str(lab.home), "SANDGATE_TEST_KEY": short})
        assert r.returncode == 125 and not marker.exists(), (r.returncode, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"sandgate: error: {lab.policy}:9: credential $SANDGATE_TEST_KEY for api.test: "), line
        assert f"the secret is {len(short)} character" in line and "at least 16" in line, line
    # The control: the same run with a secret of 16 characters starts.
    r = sg.run(cmd=["touch", str(marker)], env={**env(), "HOME": str(lab.home), "SANDGATE_TEST_KEY": "s" * 16})
    assert r.returncode == 0 and marker.exists(), r.stderr
    marker.unlink()


# ---- the sentinel anywhere else is refused ------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_the_sentinel_sent_to_another_host_or_over_plain_http_is_refused(lab: Lab, path: str) -> None:
    marks = lab.marks()
    script = """
        key = os.environ["SANDGATE_TEST_KEY"]
        curl("control", "-H", "Authorization: Bearer not-a-secret", "https://other.test/ok")
        curl("header", "-H", "Authorization: Bearer " + key, "https://other.test/leak/header")
        curl("custom-header", "-H", "X-Forwarded-Key: " + key, "https://other.test/leak/custom")
        curl("query", f"https://other.test/leak/query?k={key}")
        curl("h2", "--http2", "-H", "Authorization: Bearer " + key, "https://other.test/leak/h2")
        with_requests("requests", "GET", "https://other.test/leak/requests", headers={"X-Key": key})
        curl("plain-control", "http://other.test/ok-plain")
        curl("plain-other", "-H", "X-Key: " + key, "http://other.test/leak/plain")
        curl("plain-bound", "-H", "Authorization: Bearer " + key, "http://api.test/leak/plain-bound")
        """
    res, audit, _ = lab.run(script, path)
    assert res["control"]["status"] == 200 and res["plain-control"]["status"] == 200, res
    leaks = ("header", "custom-header", "query", "h2", "requests", "plain-other", "plain-bound")
    for name in leaks:
        assert res[name]["status"] == 403 and "leak" in res[name]["body"], (name, res[name])
        assert "SANDGATE_TEST_KEY" in res[name]["body"], (name, res[name])  # names the variable, never a value
    assert [s["target"] for s in lab.since(marks, "other")] == ["/ok"]  # the other host saw only the control
    assert [s["target"] for s in lab.since(marks, "other80")] == ["/ok-plain"]
    assert lab.since(marks, "api80") == []  # plain HTTP to the bound host: refused before it left
    assert lab.since(marks, "api") == []
    denies = [x for x in records(audit) if x["event"] in ("request", "decision") and x["action"] == "deny"]
    assert len(denies) == len(leaks), denies
    assert all("attempted leak" in x["reason"] for x in denies), denies
    text = audit_text(audit)
    assert REAL not in text and MARK not in text


def test_an_upstream_echoing_the_secret_does_not_hand_it_to_the_sandbox(lab: Lab) -> None:
    marks = lab.marks()
    script = """
        curl("echo", "-i", "https://api.test/echo")
        curl("echo-h1", "--http1.1", "-i", "https://api.test/echo")
        curl("echo-gzip", "--compressed", "-i", "https://api.test/echo")  # asks for gzip, reads it decoded
        with_requests("requests", "GET", "https://api.test/echo")  # asks for gzip by default
        """
    res, _, _ = lab.run(script)  # run() fails if the real value shows up in anything the sandbox printed
    for name in ("echo", "echo-h1", "echo-gzip", "requests"):
        assert res[name]["status"] == 200 and "authorization" in res[name]["body"].lower(), res[name]
        assert MARK not in res[name]["body"], name
    got = [header(s, "authorization") for s in lab.since(marks, "api")]
    assert got == [[f"Bearer {REAL}"]] * 4  # the upstream did receive (and echo) the real value


@pytest.mark.parametrize("path", PATHS)
def test_fronting_tricks_never_carry_the_secret_to_another_host(lab: Lab, path: str) -> None:
    """TLS to one host, a Host header (or an address) naming the other: the secret goes only where TLS was verified."""
    marks = lab.marks()
    script = f"""
        key = os.environ["SANDGATE_TEST_KEY"]
        curl("host-header", "-H", "Host: api.test", "https://other.test/front/host")
        curl("host-header-h1", "--http1.1", "-H", "Host: api.test", "https://other.test/front/host-h1")
        curl("address", "--resolve", "api.test:443:{OTHER}", "https://api.test/front/address")
        curl("sni-other", "--connect-to", "api.test:443:other.test:443", "https://api.test/front/connect-to")
        """
    lab.run(script, path)
    for name in ("other", "other80", "api80", "files"):
        assert not leaked(lab.since(marks, name), REAL, FILE_REAL, MARK), (name, lab.since(marks, name))
    # Whatever reached api.test was verified TLS to api.test itself: its own fake logged it.
    assert all(s["sni"] == "api.test" for s in lab.since(marks, "api")), lab.since(marks, "api")


def test_the_sentinel_in_a_request_body_to_another_host_is_refused(lab: Lab) -> None:
    marks = lab.marks()
    script = """
        key = os.environ["SANDGATE_TEST_KEY"]
        curl("control", "-X", "POST", "--data-binary", "token=none", "https://other.test/ok-body")
        curl("body", "-X", "POST", "--data-binary", "token=" + key, "https://other.test/leak/body")
        """
    res, audit, _ = lab.run(script)
    assert res["control"]["status"] == 200, res["control"]
    assert [s["target"] for s in lab.since(marks, "other")] == ["/ok-body"]
    assert res["body"]["status"] == 403 and "leak" in res["body"]["body"], res["body"]
    assert any("attempted leak" in x["reason"] for x in records(audit) if x["event"] == "request")


# ---- nothing inside can read the real value -----------------------------------------------------

SCAN = """
    mark = ("q7real" + "secret").encode()
    hits, checked = [], 0
    def look(path, data):
        global checked
        checked += 1
        if mark in data:
            hits.append(path)  # where, never the value: the output goes to the host's test log
    import stat
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for what in ("environ", "cmdline"):
                try:
                    look(f"/proc/{pid}/{what}", open(f"/proc/{pid}/{what}", "rb").read())
                except OSError:
                    pass
            try:  # files the processes hold open (a descriptor the launcher forgot, a memfd)
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                fds = []
            for fd in fds:
                p = f"/proc/{pid}/fd/{fd}"
                try:
                    if stat.S_ISREG(os.stat(p).st_mode):
                        look(p, open(p, "rb").read(1 << 22))
                except OSError:
                    pass
    for top in (os.environ["HOME"], "/tmp", "/run", "/etc", "/dev/shm", "/var/tmp/" + BASE, os.getcwd()):
        for dirpath, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.join(dirpath, d) != SKIP]
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    if os.path.isfile(p):
                        look(p, open(p, "rb").read(1 << 22))
                except OSError:
                    pass
    emit("scan", status=200, body=json.dumps(hits), count=checked)
    try:
        emit("token", status=200, body=open(os.path.expanduser("~/" + TOKEN)).read())
    except OSError as e:
        emit("token", status=0, body="", error=str(e))
    emit("environ", status=200, body=json.dumps(dict(os.environ)))
    """


def test_the_real_value_is_nowhere_inside(lab: Lab) -> None:
    # A child process that keeps running while the scan looks at every /proc/PID it can see.
    # SKIP: a checkout under /tmp is visible inside (runner.VIEW); its own tests hold REAL's spelling.
    script = f"BASE = {lab.base.name!r}\nTOKEN = {TOKEN_FILE!r}\nSKIP = {str(REPO)!r}\n" + textwrap.dedent(SCAN)
    script = 'import subprocess\nchild = subprocess.Popen(["sleep", "30"])\n' + script + "child.kill()\n"
    res, audit, stderr = lab.run(script)
    hits = json.loads(res["scan"]["body"])
    assert hits == [], hits
    assert res["scan"].get("count", 0) > 100  # the scan really read files and /proc entries
    assert res["token"]["status"] == 0 or FILE_REAL not in res["token"]["body"], res["token"]
    environ: dict[str, Any] = json.loads(res["environ"]["body"])
    assert environ.get("SANDGATE_TEST_KEY") not in (None, "", REAL)  # a sentinel, not the value
    # The control: the value is really there outside, where the launcher reads it and the file lives.
    assert (lab.home / TOKEN_FILE).read_text().strip() == FILE_REAL
    assert REAL not in audit_text(audit) + stderr

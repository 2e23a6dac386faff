"""Issue 27, item 4: a corporate proxy upstream of the daemon (netguard.upstreamproxy, proxy/viaproxy.py,
proxy/viamitm.py), end to end.

`sandgate run` in a World with HTTPS_PROXY / HTTP_PROXY / NO_PROXY in *its own* environment: a fake
corporate proxy (tests/support/corpproxy.py, demanding Basic auth) logs every request head it gets.
An allowed connection reaches its fake upstream *through* that proxy, which was asked for the checked
address (CONNECT 198.51.100.x:port), on every path: the front door's CONNECT and transparent TLS,
mitmproxy's plain HTTP, inspected TLS and raw relays. A denied one never appears at the proxy, a
NO_PROXY host goes direct, the credentials reach neither the sandbox nor the audit log, a refusing
proxy gives the client a clear failure and the log a record, and two runs at once on one daemon each
use their own settings.
"""

from __future__ import annotations

import base64
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support import corpproxy
from ..support.corpproxy import CorpProxy
from ..support.rootless import UnprivilegedUser
from ..support.runner import Proxy, Sandgate, curl, env, write_policy
from ..support.world import Server, World, new_world

ALLOWED, BLOCKED, DIRECT, OTHER, INSPECTED, UNLISTED = (f"198.51.100.{n}" for n in range(81, 87))
PROXY_IP, REFUSING_IP = "198.51.100.90", "198.51.100.91"
USER, PASSWORD = "corpuser", "s3cret-corp-pw"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
POLICY = textwrap.dedent("""\
    version: 1
    network:
      allow:
        - allowed.test
        - direct.test
        - other.test
        - rebind.test
        - host: inspected.test
          inspect: true
    """)
#: What the command's own proxy variables would be unset with: the transparent path.
UNSET = ["env", "-u", "HTTPS_PROXY", "-u", "https_proxy", "-u", "HTTP_PROXY", "-u", "http_proxy", "-u", "ALL_PROXY",
         "-u", "all_proxy"]  # fmt: skip


@dataclass
class Lab:
    world: World
    policy: Path
    proxy: CorpProxy
    refusing: CorpProxy
    fakes: dict[str, Server]

    def env(self, **extra: str) -> dict[str, str]:
        return {**env(), **extra}

    def corp_env(self, auth: str | None = f"{USER}:{PASSWORD}") -> dict[str, str]:
        url = self.proxy.url(auth)
        return self.env(HTTPS_PROXY=url, http_proxy=url, NO_PROXY="localhost, direct.test")

    def sandgate(self, audit: Path, timeout: float = 60) -> Sandgate:
        return Sandgate(self.world, policy=self.policy, audit=audit, quiet=True, cwd=self.world.tmp, timeout=timeout)

    def audit(self) -> Path:
        return self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"

    def requests(self, name: str) -> int:
        return len([r for r in self.fakes[name].log_records() if r["kind"] in ("http", "https")])


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with new_world() as w:
        for name, ip in (("allowed", ALLOWED), ("blocked", BLOCKED), ("direct", DIRECT), ("other", OTHER),
                         ("inspected", INSPECTED), ("unlisted", UNLISTED)):  # fmt: skip
            w.add_host(f"{name}.test", ip)
        w.add_host("rebind.test", "169.254.169.254")  # DNS only: an allowed name resolving to the metadata address
        fakes = {
            "allowed": w.serve("https", ALLOWED, 443, "allowed.test"),
            "allowed_http": w.serve("http", ALLOWED, 80, "allowed.test"),
            "blocked": w.serve("https", BLOCKED, 443, "blocked.test"),
            "direct": w.serve("https", DIRECT, 443, "direct.test"),
            "other": w.serve("https", OTHER, 443, "other.test"),
            "inspected": w.serve("https", INSPECTED, 443, "inspected.test"),
            "unlisted": w.serve("https", UNLISTED, 443, "unlisted.test"),
        }
        proxy = corpproxy.start(w, PROXY_IP, 3128, auth=f"{USER}:{PASSWORD}")
        refusing = corpproxy.start(w, REFUSING_IP, 3128, answer=403)
        try:
            yield Lab(w, write_policy(w, POLICY, "upstream-policy"), proxy, refusing, fakes)
        finally:
            proxy.stop()
            refusing.stop()


def _curl(url: str, *extra: str, ca: str | None = None, cmd: tuple[str, ...] = ()) -> str:
    """A shell line printing `<url> <status>`: the response's, else the answer to curl's CONNECT (000: none)."""
    cacert = f"--cacert {ca} " if ca else ""
    w = "-w '%{http_code}/%{http_connect}'"
    return f'echo "{url} $({" ".join(cmd)} curl -sS -m 10 -o /dev/null {w} {cacert}{" ".join(extra)} {url})"'


def _statuses(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        url, _, codes = line.strip().rpartition(" ")
        if url:
            code, _, connect = codes.partition("/")
            out[url] = connect if code == "000" and connect not in ("", "000") else code
    return out


def _secret_free(text: str) -> bool:
    return PASSWORD not in text and BASIC.split()[1] not in text


# ---- allowed through the proxy, denied never at it, NO_PROXY direct, nothing secret inside --------------


def test_allowed_flows_go_through_the_proxy_to_the_checked_address(lab: Lab) -> None:
    before = {k: lab.requests(k) for k in lab.fakes}
    seen = len(lab.proxy.seen())
    ca = str(lab.world.ca_pem)
    script = "\n".join([
        _curl("https://allowed.test/", ca=ca),  # the front door's CONNECT
        _curl("https://allowed.test/?transparent", ca=ca, cmd=tuple(UNSET)),  # the front door's transparent TLS
        _curl("http://allowed.test/"),  # mitmproxy's plain HTTP
        _curl("https://blocked.test/", ca=ca),  # denied: 403 from sandgate
        _curl("https://direct.test/", ca=ca),  # NO_PROXY: direct
        "env > inside-env.txt",
    ])  # fmt: skip
    audit = lab.audit()
    r = lab.sandgate(audit).run(cmd=["sh", "-c", script], env=lab.corp_env())
    assert r.returncode == 0, r.stderr
    got = _statuses(r.stdout)
    assert got == {
        "https://allowed.test/": "200",
        "https://allowed.test/?transparent": "200",
        "http://allowed.test/": "200",
        "https://blocked.test/": "403",
        "https://direct.test/": "200",
    }, r.stdout + r.stderr
    heads = lab.proxy.seen()[seen:]
    assert sorted(h["target"] for h in heads) == [f"{ALLOWED}:443", f"{ALLOWED}:443", f"{ALLOWED}:80"], heads
    assert all(h["method"] == "CONNECT" and h["auth"] == BASIC and h["status"] == 200 for h in heads)
    after = {k: lab.requests(k) for k in lab.fakes}
    assert after["allowed"] - before["allowed"] == 2 and after["allowed_http"] - before["allowed_http"] == 1
    assert after["direct"] - before["direct"] == 1  # reached without the proxy: it saw no DIRECT target
    assert after["blocked"] == before["blocked"]  # denied: neither the upstream nor the proxy saw it
    inside = (lab.world.tmp / "inside-env.txt").read_text()
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in inside and _secret_free(inside)  # sandgate's own, as ever
    assert _secret_free(audit.read_text())
    decisions = [x for x in read_records(audit) if x["event"] == "decision"]
    assert {(x["host"], x["action"]) for x in decisions} >= {("allowed.test", "allow"), ("blocked.test", "deny")}


def test_inspected_and_relayed_flows_go_through_the_proxy(lab: Lab) -> None:
    """mitmproxy's own paths: inspected TLS (explicit and transparent), and raw relays (a --learn flow)."""
    before_inspected, before_unlisted = lab.requests("inspected"), lab.requests("unlisted")
    seen = len(lab.proxy.seen())
    ca = str(lab.world.ca_pem)
    script = "\n".join([
        _curl("https://inspected.test/"),  # the run's CA is trusted inside (SSL_CERT_FILE...)
        _curl("https://inspected.test/?transparent", cmd=tuple(UNSET)),
        _curl("https://unlisted.test/", ca=ca),  # learn: allowed by learning, relayed by mitmproxy
        _curl("https://unlisted.test/?transparent", ca=ca, cmd=tuple(UNSET)),
    ])  # fmt: skip
    audit = lab.audit()
    r = lab.sandgate(audit).run("--learn", "--upstream-ca", ca, cmd=["sh", "-c", script], env=lab.corp_env())
    assert r.returncode == 0, r.stderr
    assert set(_statuses(r.stdout).values()) == {"200"}, r.stdout + r.stderr
    heads = lab.proxy.seen()[seen:]
    assert sorted(h["target"] for h in heads) == sorted([f"{INSPECTED}:443"] * 2 + [f"{UNLISTED}:443"] * 2), heads
    assert all(h["auth"] == BASIC for h in heads)
    assert lab.requests("inspected") - before_inspected == 2 and lab.requests("unlisted") - before_unlisted == 2
    requests = [x for x in read_records(audit) if x["event"] == "request" and x["host"] == "inspected.test"]
    assert len(requests) == 2 and all(x["status"] == 200 for x in requests)
    assert _secret_free(audit.read_text())


def test_the_ssrf_veto_still_judges_the_final_address(lab: Lab) -> None:
    """An allowed name resolving to a metadata address is refused by sandgate: the proxy never hears of it."""
    seen = len(lab.proxy.seen())
    ca = str(lab.world.ca_pem)
    script = "\n".join([_curl("https://rebind.test/", ca=ca), _curl("https://allowed.test/", ca=ca)])
    audit = lab.audit()
    r = lab.sandgate(audit).run(cmd=["sh", "-c", script], env=lab.corp_env())
    assert _statuses(r.stdout) == {"https://rebind.test/": "403", "https://allowed.test/": "200"}, r.stdout + r.stderr
    assert lab.proxy.targets()[seen:] == [f"{ALLOWED}:443"]
    vetoed = [x for x in read_records(audit) if x["event"] == "decision" and x["host"] == "rebind.test"]
    assert vetoed and all(x["action"] == "deny" for x in vetoed)


# ---- refusals by the proxy ----------------------------------------------------------------------------


def test_a_proxy_demanding_credentials_gives_the_client_a_clear_failure(lab: Lab) -> None:
    before = lab.requests("allowed"), lab.requests("allowed_http")
    seen = len(lab.proxy.seen())
    script = "\n".join([
        _curl("https://allowed.test/", ca=str(lab.world.ca_pem)),
        "curl -sS -m 10 http://allowed.test/; echo",  # mitmproxy's 502 says why in its body
    ])  # fmt: skip
    audit = lab.audit()
    r = lab.sandgate(audit).run(cmd=["sh", "-c", script], env=lab.corp_env(auth=None))
    assert r.returncode == 0, r.stderr
    assert _statuses(r.stdout)["https://allowed.test/"] == "502", r.stdout + r.stderr  # CONNECT tunnel failed
    assert "407 Proxy Authentication Required" in r.stdout
    heads = lab.proxy.seen()[seen:]
    assert [h["status"] for h in heads] == [407, 407] and all(h["auth"] is None for h in heads)
    assert (lab.requests("allowed"), lab.requests("allowed_http")) == before
    failed = [x for x in read_records(audit) if x["event"] == "request" and x["method"] == "CONNECT"]
    assert {x["path"] for x in failed} == {f"{ALLOWED}:443", f"{ALLOWED}:80"}
    assert all(x["status"] is None and "407 Proxy Authentication Required" in x["reason"] for x in failed), failed
    assert all(f"http://{PROXY_IP}:3128" in x["reason"] for x in failed)


def test_the_option_wins_over_the_environment(lab: Lab) -> None:
    """--upstream-proxy URL replaces HTTPS_PROXY (here a proxy answering 403); `none` goes direct."""
    seen, refused = len(lab.proxy.seen()), len(lab.refusing.seen())
    before = lab.requests("allowed")
    line = _curl("https://allowed.test/", ca=str(lab.world.ca_pem))
    audit = lab.audit()
    sg = lab.sandgate(audit)
    r = sg.run("--upstream-proxy", lab.refusing.url(), cmd=["sh", "-c", line], env=lab.corp_env())
    assert r.returncode == 0 and _statuses(r.stdout) == {"https://allowed.test/": "502"}, r.stdout + r.stderr
    assert lab.refusing.targets()[refused:] == [f"{ALLOWED}:443"] and len(lab.proxy.seen()) == seen
    assert any("403 Forbidden" in x["reason"] for x in read_records(audit) if x["event"] == "request")
    r = sg.run("--upstream-proxy", "none", cmd=["sh", "-c", line], env=lab.corp_env())
    assert _statuses(r.stdout) == {"https://allowed.test/": "200"}, r.stdout + r.stderr
    assert len(lab.proxy.seen()) == seen and len(lab.refusing.seen()) == refused + 1
    assert lab.requests("allowed") == before + 1


def test_a_bad_proxy_setting_is_one_clear_line(lab: Lab) -> None:
    r = lab.sandgate(lab.audit()).run(cmd=["true"], env=lab.env(HTTPS_PROXY="socks5://127.0.0.1:1080"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("sandgate: error: HTTPS_PROXY: only http:// proxies")
    assert "Traceback" not in r.stderr


def test_by_name_the_proxy_is_asked_for_the_name(lab: Lab) -> None:
    """--upstream-proxy-by-name: CONNECT allowed.test:443 (the proxy resolves it; documented: no pin then)."""
    seen = len(lab.proxy.seen())
    line = _curl("https://allowed.test/", ca=str(lab.world.ca_pem))
    r = lab.sandgate(lab.audit()).run("--upstream-proxy-by-name", cmd=["sh", "-c", line], env=lab.corp_env())
    assert _statuses(r.stdout) == {"https://allowed.test/": "200"}, r.stdout + r.stderr
    assert lab.proxy.targets()[seen:] == ["allowed.test:443"]


def test_sandgate_proxy_tunnels_through_the_upstream_proxy_too(lab: Lab) -> None:
    seen = len(lab.proxy.seen())
    p = Proxy(lab.world, lab.policy, listen="127.0.0.1:3191",
              extra=["--upstream-proxy", lab.proxy.url(f"{USER}:{PASSWORD}")])  # fmt: skip
    try:
        ok = curl(lab.world, "https://allowed.test/", "-x", p.url, "--cacert", str(lab.world.ca_pem))
        denied = curl(lab.world, "https://blocked.test/", "-x", p.url, "--cacert", str(lab.world.ca_pem))
    finally:
        p.stop()
    assert ok.status == 200 and ok.body == "hello from allowed.test", ok
    assert denied.code != 0
    assert lab.proxy.targets()[seen:] == [f"{ALLOWED}:443"]
    assert all(h["auth"] == BASIC for h in lab.proxy.seen()[seen:])
    assert _secret_free(p.audit.read_text())


# ---- one daemon, two runs, each its own settings ------------------------------------------------------


def test_two_runs_at_once_each_use_their_own_proxy_settings(lab: Lab) -> None:
    seen = len(lab.proxy.seen())
    before_other = lab.requests("other")
    ca = str(lab.world.ca_pem)
    go = lab.world.tmp / f"go-{time.monotonic_ns()}"
    first = _curl("https://allowed.test/", ca=ca)
    wait = f"i=0; while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"
    with_proxy = lab.sandgate(lab.audit()).popen(
        cmd=["sh", "-c", f"{first}\n{wait}\n{first}"], env=lab.corp_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        _wait_for(lambda: len(lab.proxy.seen()) > seen)  # the first run is bound and has used its proxy
        r = lab.sandgate(lab.audit()).run(cmd=["sh", "-c", _curl("https://other.test/", ca=ca)], env=lab.env())
        assert _statuses(r.stdout) == {"https://other.test/": "200"}, r.stdout + r.stderr
        assert with_proxy.poll() is None  # both runs were live on the one daemon
    finally:
        go.touch()
        out, _ = with_proxy.communicate(timeout=60)
    assert out.count("https://allowed.test/ 200/") == 2, out
    assert lab.proxy.targets()[seen:] == [f"{ALLOWED}:443", f"{ALLOWED}:443"]  # never other.test's address
    assert lab.requests("other") == before_other + 1


def test_rootless_a_users_run_goes_through_its_proxy_too(lab: Lab, unprivileged: UnprivilegedUser) -> None:
    """The throwaway user (no sudo): its own daemon, the proxy from its own environment."""
    lab.world.tmp.chmod(0o755)  # the user reads the policy here
    policy = write_policy(lab.world, POLICY, "rootless-upstream")
    policy.chmod(0o644)
    work = unprivileged.home / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, unprivileged.uid, unprivileged.gid)
    ca = work / "ca.pem"  # the world's directory is under the host's /tmp: not seen inside
    ca.write_bytes(lab.world.ca_pem.read_bytes())
    seen, before = len(lab.proxy.seen()), lab.requests("allowed")
    sg = Sandgate(unprivileged.runner(lab.world), policy=policy, cwd=work, quiet=True,
                  env={**lab.corp_env(), "HOME": str(unprivileged.home)})  # fmt: skip
    script = "\n".join([_curl("https://allowed.test/", ca=str(ca)), _curl("https://blocked.test/", ca=str(ca))])
    r = sg.run(cmd=["sh", "-c", script], audit=work / "audit.jsonl")
    assert r.returncode == 0, r.stderr
    assert _statuses(r.stdout) == {"https://allowed.test/": "200", "https://blocked.test/": "403"}, r.stdout + r.stderr
    assert lab.proxy.targets()[seen:] == [f"{ALLOWED}:443"] and lab.requests("allowed") == before + 1
    assert all(h["auth"] == BASIC for h in lab.proxy.seen()[seen:])


def _wait_for(pred: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)

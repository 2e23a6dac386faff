"""A checkout's own ./.sandgate.yaml, end to end: it narrows until the user trusts it, and nothing
trusts an absurd cidr or a writable home.

The real `sandgate run` inside a test World (fake servers, fake DNS). The hostile file is the one
from issue 10: two /1 cidrs (the whole IPv4 internet), `write: ["~"]` and `env.keep: ["*"]`.
Every blocked request is judged by the fake server's own log, next to a request that shows the
same path works once the policy is trusted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from netguard.audit import read_records

from ..support.runner import SANDGATE, Sandgate, env
from ..support.world import Server, World, new_world

FAKE, DENIED, BY_IP = "198.51.100.30", "198.51.100.31", "198.51.100.32"
SECRET = "sgsecret-7d1c"

HOSTILE = """\
version: 1
network:
  allow:
    - cidr: 0.0.0.0/1
    - cidr: 128.0.0.0/1
  deny:
    - denied.test
filesystem:
  write: ["~"]
  read_deny: [private-notes.txt]
env:
  keep: ["*"]
  drop: [PROJECT_VISIBLE]
"""


@dataclass
class Ws:
    world: World
    servers: dict[str, Server]
    state: Path  # XDG_STATE_HOME: the trust list lives here, outside every workspace
    homes: Path  # not under /tmp: the sandbox's /tmp is its own, so a home there would prove nothing

    def project(self, policy: str) -> tuple[Path, Path]:
        """(a fresh checkout holding `policy` as .sandgate.yaml, a fresh $HOME outside it)."""
        stamp = time.monotonic_ns()
        proj, home = self.world.tmp / f"proj-{stamp}", self.homes / f"home-{stamp}"
        proj.mkdir()
        home.mkdir()
        (proj / ".sandgate.yaml").write_text(policy)
        return proj, home

    def env(self, home: Path) -> dict[str, str]:
        return {
            **env(),
            "HOME": str(home),
            "XDG_STATE_HOME": str(self.state),
            "SANDGATE_E2E_TOKEN": SECRET,
            "PROJECT_VISIBLE": "visible-value",
        }

    def sandgate(self, proj: Path, home: Path, *args: str) -> tuple[int, str, list[str], Path]:
        """`sandgate run` in `proj`: (exit code, stdout, stderr lines, audit log)."""
        audit = self.world.tmp / f"audit-{time.monotonic_ns()}.jsonl"
        sg = Sandgate(self.world, audit=audit, quiet=True, cwd=proj, timeout=90)  # no --policy: .sandgate.yaml
        r = sg.run(*args, env=self.env(home))
        return r.returncode, r.stdout, r.stderr.splitlines(), audit

    def trust(self, proj: Path, home: Path, *args: str) -> list[str]:
        r = self.world.run([*SANDGATE, "trust", *args], cwd=proj, env=self.env(home))
        assert r.returncode == 0, r.stderr
        return str(r.stderr).splitlines()

    def mark(self) -> dict[str, int]:
        return {k: len(v.log_records()) for k, v in self.servers.items()}

    def untouched(self, mark: dict[str, int], *names: str) -> bool:
        return all(len(self.servers[n].log_records()) == mark[n] for n in names)


@pytest.fixture(scope="module")
def ws() -> Iterator[Ws]:
    if os.geteuid() != 0:
        pytest.fail("e2e tests need root (they build network namespaces)", pytrace=False)
    with new_world() as w:
        w.add_host("fake.test", FAKE)
        w.add_host("denied.test", DENIED)
        servers = {
            "fake": w.serve("http", FAKE, 80, "fake.test"),
            "denied": w.serve("http", DENIED, 80, "denied.test"),
            "by_ip": w.serve("http", BY_IP, 80, "by-ip"),
        }
        homes = Path(tempfile.mkdtemp(prefix="sandgate-e2e-homes-", dir="/var/tmp"))
        try:
            yield Ws(w, servers, w.tmp / "state", homes)
        finally:
            from fsguard import homeoverlay

            homeoverlay.forget_under(os.getuid(), str(homes))  # the fake homes' sandbox layers too
            shutil.rmtree(homes, ignore_errors=True)


def curl(url: str) -> str:
    return f"curl -sS -m 8 -o /dev/null -w '{url}=%{{http_code}}\\n' {url}"


PROBES = " ; ".join(
    [
        curl(f"http://{BY_IP}/"),
        curl("http://denied.test/"),
        '{ echo planted > "$HOME/planted"; } 2>/dev/null && echo wrote-home || echo home-write-failed',
        'echo "token=${SANDGATE_E2E_TOKEN:-dropped}"',
        'echo "visible=${PROJECT_VISIBLE:-dropped}"',
        'echo "notes=$(cat private-notes.txt 2>/dev/null)"',
    ]
)


def decisions(audit: Path) -> list[Any]:
    return [r for r in read_records(audit) if r["event"] == "decision"]


def test_an_untrusted_checkout_policy_gets_nothing_it_asks_for_but_its_denials(ws: Ws) -> None:
    proj, home = ws.project(HOSTILE)
    (proj / "private-notes.txt").write_text(SECRET)
    before = ws.mark()
    code, out, err, audit = ws.sandgate(proj, home, "--", "sh", "-c", PROBES)
    assert code == 0, err
    assert err == [
        (
            "sandgate: .sandgate.yaml is not trusted, so only what it forbids applies; ignored: network.allow, "
            "filesystem.write, env.keep; to trust it: sandgate trust .sandgate.yaml"
        )
    ]
    # The two /1s are ignored: the request by IP never reached the server.
    assert f"http://{BY_IP}/=403" in out and ws.untouched(before, "by_ip", "denied")
    # write: ["~"] is ignored: whatever the command wrote under ~ went to the sandbox's own home
    # layer (the overlay), and nothing landed in the real home.
    assert not (home / "planted").exists()
    # env.keep: ["*"] is ignored: the token stays dropped. Its own drop and read_deny do apply.
    assert "token=dropped" in out and SECRET not in out and "visible=dropped" in out and "notes=\n" in out
    # Its deny rule applies, and is the reason given: the denial names the file's line.
    [denied] = [d for d in decisions(audit) if d["host"] == "denied.test"]
    assert denied["action"] == "deny" and denied["rule"] == ".sandgate.yaml:7", denied


def test_trusting_a_hostile_file_still_refuses_a_writable_home_and_wide_cidrs(ws: Ws) -> None:
    proj, home = ws.project(HOSTILE)
    ws.trust(proj, home)
    for flags in ([], ["--allow-wide-cidr"]):  # the flag is about cidrs only
        code, _, err, _ = ws.sandgate(proj, home, *flags, "--", "true")
        assert code == 125 and err == [
            (
                f"sandgate: error: .sandgate.yaml:9: 'filesystem.write' entry '~' is your home directory ({home}): a "
                "command could plant files that run outside the sandbox (~/.bashrc, ~/.ssh/authorized_keys); writes "
                "under ~ already work inside (kept in sandgate's home layer), so name the project directories it must "
                "write instead"
            )
        ], err
    (proj / ".sandgate.yaml").write_text(HOSTILE.replace('  write: ["~"]\n', ""))
    ws.trust(proj, home)
    code, _, err, _ = ws.sandgate(proj, home, "--", "true")
    assert code == 125 and len(err) == 1, err
    assert err[0].startswith(
        "sandgate: error: .sandgate.yaml:4: network.allow: cidr 0.0.0.0/1 covers 1/2 of all IPv4"
    ), err
    before = ws.mark()
    code, out, err, _ = ws.sandgate(proj, home, "--allow-wide-cidr", "--", "sh", "-c", curl(f"http://{BY_IP}/"))
    assert (code, out.strip(), err) == (0, f"http://{BY_IP}/=200", []), err
    assert not ws.untouched(before, "by_ip")
    assert not (home / "planted").exists()


def test_after_sandgate_trust_the_checkout_policy_widens_until_it_is_edited(ws: Ws) -> None:
    proj, home = ws.project("version: 1\nnetwork:\n  allow: [fake.test]\n")
    probe = ["--", "sh", "-c", curl("http://fake.test/")]
    before = ws.mark()
    code, out, err, _ = ws.sandgate(proj, home, *probe)
    assert out.strip() == "http://fake.test/=403" and ws.untouched(before, "fake"), (out, err)
    assert len(err) == 1 and "to trust it: sandgate trust .sandgate.yaml" in err[0]

    assert ws.trust(proj, home)[0].startswith(f"sandgate: trusted {proj / '.sandgate.yaml'} (sha256 ")
    code, out, err, _ = ws.sandgate(proj, home, *probe)
    assert (code, out.strip(), err) == (0, "http://fake.test/=200", []), err
    assert not ws.untouched(before, "fake")  # the server saw it

    with (proj / ".sandgate.yaml").open("a") as f:
        f.write("# an innocent-looking edit\n")
    before = ws.mark()
    code, out, err, _ = ws.sandgate(proj, home, *probe)
    assert out.strip() == "http://fake.test/=403" and ws.untouched(before, "fake"), (out, err)
    assert err == [
        (
            "sandgate: .sandgate.yaml changed since you trusted it, so only what it forbids applies; "
            "ignored: network.allow; to trust it: sandgate trust .sandgate.yaml"
        )
    ]

    ws.trust(proj, home)
    assert ws.sandgate(proj, home, *probe)[1].strip() == "http://fake.test/=200"
    ws.trust(proj, home, "--revoke")
    assert ws.sandgate(proj, home, *probe)[1].strip() == "http://fake.test/=403"


def test_an_explicit_policy_may_widen_and_the_flag_allows_wide_cidrs(ws: Ws) -> None:
    proj, home = ws.project("version: 1\nnetwork:\n  deny: [fake.test]\n")  # ignored: --policy is given
    explicit = proj.parent / f"explicit-{time.monotonic_ns()}.yaml"
    explicit.write_text(
        f"version: 1\nnetwork:\n  allow:\n    - fake.test\n    - {BY_IP}\nenv:\n  keep: [SANDGATE_E2E_TOKEN]\n"
    )
    before = ws.mark()
    code, out, err, _ = ws.sandgate(
        proj,
        home,
        "--policy",
        str(explicit),
        "--",
        "sh",
        "-c",
        " ; ".join(
            [curl("http://fake.test/"), curl(f"http://{BY_IP}/"), 'echo "token=${SANDGATE_E2E_TOKEN:-dropped}"']
        ),
    )
    assert code == 0 and err == [], err
    assert "http://fake.test/=200" in out and f"http://{BY_IP}/=200" in out and f"token={SECRET}" in out
    assert not ws.untouched(before, "fake") and not ws.untouched(before, "by_ip")

    halves = proj.parent / f"halves-{time.monotonic_ns()}.yaml"
    halves.write_text("version: 1\nnetwork:\n  allow:\n    - cidr: 0.0.0.0/1\n    - cidr: 128.0.0.0/1\n")
    code, _, err, _ = ws.sandgate(proj, home, "--policy", str(halves), "--", "true")
    assert (
        code == 125
        and len(err) == 1
        and err[0].startswith(f"sandgate: error: {halves}:4: network.allow: cidr 0.0.0.0/1")
    )
    before = ws.mark()
    code, out, err, _ = ws.sandgate(
        proj, home, "--policy", str(halves), "--allow-wide-cidr", "--", "sh", "-c", curl(f"http://{BY_IP}/")
    )
    assert (code, out.strip()) == (0, f"http://{BY_IP}/=200"), err
    assert not ws.untouched(before, "by_ip")

"""`sandgate verify` as the regression suite of the boundary: every probe row is asserted, and
weakening one mechanism (through the internal test-only switch) makes exactly its rows fail.

Every probe runs twice (identity "root": the command is uid 0 inside, what root gets by default;
"user": an unprivileged command), and verify runs both as root and as a throwaway ordinary user
without sudo (its world then lives in a user namespace of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsguard import landlock
from selftest import inspectnet, verify
from selftest.frontdoorrow import front_door_row
from selftest.hostrows import FRONT_DOOR
from selftest.passes import passes
from selftest.probes import core

from ..support.verifyruns import Rows, VerifyRun, sandgate_verify
from ..support.world import World

REPO = Path(__file__).resolve().parent.parent.parent
IDENTITIES = ("root", "user")
ROW_KEYS = {"group", "probe", "context", "expected", "observed", "ok", "evidence", "identity"}


def _assert_complete(rows: Rows) -> None:
    """Every probe, in every context it declares, for both identities: nothing silently skipped."""
    seen = {(r["group"], r["probe"], r["context"], r["identity"]) for r in rows}
    for group, probe, _ in core.probe_list():
        for ctx in core.REGISTRY[probe].contexts:
            for who in IDENTITIES:
                assert (group, probe, ctx, who) in seen, (probe, ctx, who)
    for who in IDENTITIES:
        assert ("process", "daemon_after_run", "daemon", who) in seen
        assert ("network", FRONT_DOOR, "child", who) in seen
    assert not [r for r in rows if r["observed"] == "unsupported"]
    assert all(set(r) == ROW_KEYS for r in rows)  # the v1 keys unchanged, plus "identity"


def test_every_probe_behaves_as_expected_in_every_context(verify_as_root: VerifyRun) -> None:
    run = verify_as_root  # the whole run, shared with test_setid_userns_e2e (support/verifyruns.py)
    code, rows, err = run.code, run.rows, run.err
    bad = [r for r in rows if not r["ok"]]
    assert code == 0 and rows and not bad, (bad, err[-2000:])
    _assert_complete(rows)
    by = {(r["probe"], r["context"], r["identity"]): str(r["evidence"]) for r in rows}
    for ctx in core.CONTEXTS:
        for who in IDENTITIES:
            # The verdict of netns_tamper is the canary's; that each change was refused is in its detail.
            tamper = by["netns_tamper", ctx, who]
            for change in ("nft flush ruleset", "ip link add veth", "ip route replace default"):
                assert f"{change}: refused" in tamper, tamper
            setns = by["setns_host_netns", ctx, who]
            assert "EPERM" in setns and "/run/netns/sandgate-v" in setns, setns
            assert "ECONNREFUSED" in by["host_loopback_service", ctx, who]  # the sandbox's own, empty loopback
            # Issue 13: refused for the right reason, by sandgate, through the run's own CA.
            if ctx == "child":  # the clone/push rows run in the command's own context only
                assert "403" in by["git_push_refused", ctx, who]
            rules = by["http_rule_refusals", ctx, who]
            assert "on 1 connection(s)" in rules and "403 sandgate: request refused" in rules, rules  # kept alive
            assert "attempted credential leak" in by["sentinel_leak", ctx, who]
            assert "sandgate inspection CA" in by["inspected_ca_trusted", ctx, who]
    # What verify planted outside is gone again right after it, and the host's name never changed.
    before, after = run.before, run.after
    assert before is not None and after is not None
    assert after.hostname == before.hostname and not after.keys and not (after.shm - before.shm)
    assert "sandgate-v" not in after.netns


#: Without a network namespace of its own (the "firewall" weakening) the command shares the world's:
#: nothing redirects or drops, so every direct connection reaches its canary; DNS goes to the world's
#: resolver (no resolver of our own is in /etc/resolv.conf); 127.0.0.1 is the host's.
OPEN_NETWORK_FAILS = {
    "direct_tcp_ip",
    "allowed_ip_other_port",
    "udp",
    "quic",  # nothing dropped
    "blocked_transparent",
    "sni_spoof",
    "host_mismatch",  # no transparent proxy: the blocked IP answers itself
    "dns_udp_rogue",
    "dns_tcp_rogue",
    "dns_txt_exfil",  # any resolver, and the world's relays the secret
    "dns_smuggling",  # the world's resolver sees the client's own bytes: extra records, options, case
    "wildcard_dns_types",  # the world's resolver answers TXT/NULL/MX for any name: nothing refuses them
    "rebind_own_address",  # transparently, the name leads straight to the world's own address
    "host_loopback_service",  # the host's own loopback services
    "netns_tamper",  # its final connection goes straight through
}


#: What does not depend on the network namespace and must still hold without it: the proxy's
#: decisions, the capability checks (setns), the mount namespace (path_unix).
NAMESPACE_INDEPENDENT = {"https_proxy_vars", "blocked_via_proxy", "rebind_loopback", "setns_host_netns", "path_unix"}


def test_no_network_namespace_makes_exactly_the_network_rows_fail_with_canary_evidence() -> None:
    # The rows the weakening must flip and the ones it must leave alone (the full run above covers the rest).
    probes = OPEN_NETWORK_FAILS | NAMESPACE_INDEPENDENT | {"abstract_unix"}
    code, rows, err = sandgate_verify("--only", ",".join(sorted(probes)), weaken="firewall")
    assert code == 1, err[-2000:]
    assert {r["probe"] for r in rows} == probes  # the selection ran exactly these
    expected = set(OPEN_NETWORK_FAILS)
    if landlock.abi_version() < 6:
        expected.add("abstract_unix")  # else Landlock's abstract-socket scope still keeps it out
    failed = {(r["probe"], r["context"], r["identity"]): r for r in rows if not r["ok"]}
    assert {probe for probe, _, _ in failed} == expected
    for probe in expected:
        for ctx in core.CONTEXTS:
            for who in IDENTITIES:
                row = failed[(probe, ctx, who)]
                assert row["observed"] == "permitted" and "canary saw it" in str(row["evidence"]), row
    assert {r["probe"] for r in rows if r["ok"]} >= NAMESPACE_INDEPENDENT


def test_cap_net_admin_flushes_the_table_yet_the_linkless_namespace_reaches_nothing() -> None:
    # The tamper probe, and direct ways out its changes could have opened.
    probes = {"netns_tamper", "direct_tcp_ip", "udp", "dns_udp_rogue", "ipv6"}
    code, rows, err = sandgate_verify("--only", ",".join(sorted(probes)), weaken="netadmin")
    assert code == 0 and not [r for r in rows if not r["ok"]], err[-2000:]
    assert {r["probe"] for r in rows} == probes
    for ctx in core.CONTEXTS:
        root = next(r for r in rows if (r["probe"], r["context"], r["identity"]) == ("netns_tamper", ctx, "root"))
        # The weakening took effect (the probe's own detail), and still no canary saw a thing: there
        # is no link out of the namespace, whatever its table says.
        assert root["observed"] == "blocked" and "nft flush ruleset: done" in str(root["evidence"]), root
        assert "ip link add veth: done" in str(root["evidence"]) and "canary saw it" not in str(root["evidence"])
        user = next(r for r in rows if (r["probe"], r["context"], r["identity"]) == ("netns_tamper", ctx, "user"))
        assert "nft flush ruleset: refused" in str(user["evidence"])  # an unprivileged command holds nothing


def test_removing_the_git_hooks_protection_makes_that_probe_fail() -> None:
    probes = {"git_hooks", "rename_protected", "git_config", "create_protected", "git_indirection", "write_workspace"}
    code, rows, err = sandgate_verify("--only", ",".join(sorted(probes)), weaken="git-hooks")
    assert code == 1, err[-2000:]
    assert {r["probe"] for r in rows} == probes
    failed = {(r["probe"], r["identity"]): r for r in rows if not r["ok"]}
    # Only the weakened mechanism: a hook can be planted, and .git/hooks (no longer a mount point)
    # renamed away; .git itself and .git/config stay protected.
    assert set(failed) == {(probe, who) for probe in ("git_hooks", "rename_protected") for who in IDENTITIES}
    for who in IDENTITIES:
        assert "renamed .git/hooks" in str(failed["rename_protected", who]["evidence"])


#: Widening verify's inspected hosts (every request allowed on the git and API hosts, through a
#: second inspecting entry, which adds to the first) must make exactly the rule rows fail, judged by
#: what the fake upstreams saw and hold.
WIDE_RULES = """\
version: 1
network:
  allow:
    - host: git.verify.test
      inspect: true
    - host: api.verify.test
      inspect: true
"""


def test_widening_the_http_rules_makes_exactly_the_refusal_rows_fail_with_upstream_evidence(tmp_path: Path) -> None:
    wide = tmp_path / "wide.yaml"
    wide.write_text(WIDE_RULES)
    wide.chmod(0o644)
    refused = {"git_push_refused", "http_rule_refusals"}
    probes = refused | {
        "git_fetch_inspected",
        "sentinel_leak",
        "secret_brokered",
        "ca_key_hidden",
        "inspected_ca_trusted",
    }
    code, rows, err = sandgate_verify("--only", ",".join(sorted(probes)), "--policy", str(wide))
    assert code == 1, err[-2000:]
    assert {r["probe"] for r in rows} == probes
    failed = {(r["probe"], r["context"], r["identity"]): r for r in rows if not r["ok"]}
    assert {probe for probe, _, _ in failed} == refused, failed
    for who in IDENTITIES:
        push = failed["git_push_refused", "child", who]  # run by the command itself (INSPECTION_CONTEXTS)
        assert push["observed"] == "permitted" and "pushed branch verify-" in str(push["evidence"]), push
        for ctx in core.CONTEXTS:
            rules = failed["http_rule_refusals", ctx, who]
            assert rules["observed"] == "permitted" and "canary saw it" in str(rules["evidence"]), rules
    assert {r["probe"] for r in rows if r["ok"]} == probes - refused


#: The front door row's policy widened (every request on the git host allowed): its push must then
#: reach the git canary, and the row must say so from the canary's log.
WIDE_GIT = f"version: 1\nnetwork:\n  allow:\n    - host: {inspectnet.GIT_HOST}\n      inspect: true\n"


def test_the_front_door_row_holds_and_fails_once_its_policy_lets_the_push_through(world: World) -> None:
    ups = inspectnet.prepare(world)
    world.serve_many([ups.canaries[0]])  # the git host alone: the row's only upstream
    root = passes()[0]  # the command as root inside: verify's first pass
    bases = [world.tmp / "fd-tight", world.tmp / "fd-wide"]
    for base in bases:
        (base / "home").mkdir(parents=True)
    # The tight run first: both use the pass's marker, and the wide run's push stays in the canary's log.
    row = front_door_row(world, root, bases[0], bases[0] / "home", "FAKE-KEY-t", "t0ken")
    assert row.ok and row.observed == "blocked", row
    assert "(domain fronting)" in row.evidence and "git-receive-pack" in row.evidence, row
    wide = front_door_row(world, root, bases[1], bases[1] / "home", "FAKE-KEY-t", "t0ken", policy=WIDE_GIT)
    assert not wide.ok and wide.observed == "permitted", wide
    assert wide.evidence.startswith('canary saw it: {"body": "0000/verify/frontdoor-root/'), wide  # the push's body
    pushes = [r for r in _git_requests(world) if r["method"] == "POST"]
    assert [r["path"] for r in pushes] == [f"{inspectnet.REPO_PATH}/git-receive-pack"]  # the wide run's only


def _git_requests(world: World) -> list[dict[str, object]]:
    """The git canary's request records."""
    return [r for s in world.servers if s.kind == "git" for r in s.log_records("request")]


def test_docs_coverage_table_is_generated_from_the_probe_list() -> None:
    assert verify.coverage_markdown() in (REPO / "docs" / "verify.md").read_text()


def test_verify_refuses_an_unknown_probe_name_before_building_anything() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "verify", "--only", "network,git_hookz"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 125 and r.stderr.startswith("sandgate: error: --only: unknown probe or group git_hookz")
    assert "Traceback" not in r.stderr


def test_verify_reports_a_bad_policy_before_building_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nnetwork:\n  allow: ['*']\n")
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "verify", "--policy", str(bad)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 125 and r.stderr.startswith(f"sandgate: error: {bad}:3:")


def test_ctrl_c_removes_everything_verify_built() -> None:
    import signal
    import time

    before = set(os.listdir("/var/tmp")) | set(os.listdir("/tmp"))
    p = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", "verify"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO)},
        # As a terminal's foreground job: a suite started in the background (`cmd &` in a script) has
        # SIGINT ignored, which its children inherit and Python keeps (then Ctrl-C would mean nothing).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    ours = f"sandgate-v{p.pid}x"  # this verify's world (World names it by pid): not another run's
    deadline = time.monotonic() + 30
    while ours not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    time.sleep(3)  # the probes are running inside `sandgate run` now
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert f"sandgate-v{p.pid}" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sandgate-vc{p.pid}" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    after = set(os.listdir("/var/tmp")) | set(os.listdir("/tmp"))
    # verify's scratch trees and anything named by its pid (a test world's own dirs are not its)
    assert not [x for x in after - before if x.startswith("sandgate-verify-") or str(p.pid) in x]
    runners = "selftest.probes|selftest.canary"
    assert subprocess.run(["pgrep", "-f", runners], capture_output=True).returncode == 1


def test_an_ordinary_user_runs_verify_without_sudo(verify_as_user: VerifyRun) -> None:
    """No root anywhere: verify builds its world in a user namespace of its own, runs the rootless path."""
    rows = verify_as_user.rows  # the whole run, shared with test_setid_userns_e2e (support/verifyruns.py)
    bad = [x for x in rows if not x["ok"]]
    assert verify_as_user.code == 0 and rows and not bad, (bad, verify_as_user.err[-2000:])
    _assert_complete(rows)
    setns = [str(x["evidence"]) for x in rows if x["probe"] == "setns_host_netns"]
    # Its world has no /run/netns name: the setns target is the rootless world's own bound handle.
    assert all("EPERM" in e and "/world-netns" in e for e in setns), setns

"""`sandgate verify` as the regression suite of the boundary: every probe row is asserted, and
weakening one mechanism (through the internal test-only switch) makes exactly its rows fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import probes, verify

REPO = Path(__file__).resolve().parent.parent


def sandgate_verify(*args: str, weaken: str = "") -> tuple[int, list[dict[str, object]], str]:
    if os.geteuid() != 0:
        pytest.fail("sandgate verify needs root", pytrace=False)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    if weaken:
        env["SANDGATE_INTERNAL_WEAKEN"] = weaken
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "verify", "--json", *args], capture_output=True,
                       text=True, env=env, cwd="/", timeout=300)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else []), r.stderr


def test_every_probe_behaves_as_expected_in_every_context() -> None:
    code, rows, err = sandgate_verify()
    bad = [r for r in rows if not r["ok"]]
    assert code == 0 and rows and not bad, (bad, err[-2000:])
    seen = {(r["group"], r["probe"], r["context"]) for r in rows}
    for group, probe, _ in probes.probe_list():
        contexts = {"child"} if probe == "tiocsti" else {"child", "grandchild", "daemon"}
        for ctx in contexts:
            assert (group, probe, ctx) in seen, (probe, ctx)  # nothing silently skipped
    assert ("process", "daemon_after_run", "daemon") in seen
    assert not [r for r in rows if r["observed"] == "unsupported"]
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "sandgate-v" not in leftovers


def test_an_open_firewall_makes_the_direct_tcp_and_udp_probes_fail_with_canary_evidence() -> None:
    code, rows, _ = sandgate_verify("--only", "network", weaken="firewall")
    assert code == 1
    failed = {(r["probe"], r["context"]): r for r in rows if not r["ok"]}
    for probe in ("direct_tcp_ip", "udp", "quic", "gateway_service"):
        for ctx in ("child", "grandchild", "daemon"):
            row = failed[(probe, ctx)]
            assert row["observed"] == "permitted" and "canary saw it" in str(row["evidence"]), row
    # What does not depend on the firewall still holds: DNS and the proxy's decisions.
    still_ok = {r["probe"] for r in rows if r["ok"]}
    assert {"https_proxy_vars", "blocked_via_proxy", "dns_udp_rogue", "rebind_loopback"} <= still_ok


def test_removing_the_git_hooks_protection_makes_that_probe_fail() -> None:
    code, rows, _ = sandgate_verify("--only", "filesystem", weaken="git-hooks")
    assert code == 1
    failed = {r["probe"] for r in rows if not r["ok"]}
    assert "git_hooks" in failed
    assert "git_config" not in failed and "write_outside" not in failed  # only the weakened mechanism


def test_readme_coverage_table_is_generated_from_the_probe_list() -> None:
    assert verify.coverage_markdown() in (REPO / "README.md").read_text()


def test_verify_reports_a_bad_policy_before_building_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nnetwork:\n  allow: ['*']\n")
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "verify", "--policy", str(bad)], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert r.returncode == 125 and r.stderr.startswith(f"sandgate: error: {bad}:3:")


def test_ctrl_c_removes_everything_verify_built() -> None:
    import signal
    import time
    before = set(os.listdir("/var/tmp")) | set(os.listdir("/tmp"))
    p = subprocess.Popen([sys.executable, "-m", "launcher.cli", "verify"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd="/",
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 30
    while "sandgate-v" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    time.sleep(3)  # the probes are running inside `sandgate run` now
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "sandgate-v" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    after = set(os.listdir("/var/tmp")) | set(os.listdir("/tmp"))
    assert not [x for x in after - before if x.startswith("sandgate")]
    assert subprocess.run(["pgrep", "-f", "launcher.probes|launcher.canary"], capture_output=True).returncode == 1

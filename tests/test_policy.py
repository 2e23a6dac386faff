"""Policy files: every user mistake is one message naming FILE:LINE; good files give the right rules."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.policy import PolicyFileError, build_policy, bundled_names, describe_bundled
from netguard.policy import DEFAULT_ALLOW_PORTS

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def load(tmp_path: Path, text: str):
    return build_policy([write(tmp_path, text)], [], [])


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(PolicyFileError) as e:
        load(tmp_path, text)
    return str(e.value)


BAD = [
    # (policy text, expected line, fragment of the message)
    ("network: {}\n", 1, "missing 'version: 1'"),
    ("version: 2\n", 1, "unsupported version 2"),
    ("version: true\n", 1, "unsupported version True"),
    ("version: 1\nnetwrok: {}\n", 2, "unknown key 'netwrok'"),
    ("version: 1\nnetwork:\n  alow: []\n", 3, "unknown key 'network.alow'"),
    ("version: 1\nnetwork: [a]\n", 2, "'network' must be a mapping"),
    ("version: 1\nnetwork:\n  allow: pypi.org\n", 3, "'network.allow' must be a list"),
    ("version: 1\nnetwork:\n  allow:\n    - \"*\"\n", 4, "would match every host"),
    ("version: 1\nnetwork:\n  allow:\n    - \"*.\"\n", 4, "would match every host"),
    ("version: 1\nnetwork:\n  allow:\n    - \"*..org\"\n", 4, "empty label after '*.'"),
    ("version: 1\nnetwork:\n  allow:\n    - \"a.*.org\"\n", 4, "'*' is only allowed as the whole first label"),
    ("version: 1\nnetwork:\n  allow:\n    - \"*foo.org\"\n", 4, "'*' is only allowed"),
    ("version: 1\nnetwork:\n  allow:\n    - \"a..b\"\n", 4, "invalid host 'a..b'"),
    ("version: 1\nnetwork:\n  allow:\n    - \"*.10.0.0.1\"\n", 4, "a wildcard cannot cover an IP address"),
    ("version: 1\nnetwork:\n  allow:\n    - ok.org\n    - cidr: 10.0.0.300/8\n", 5, "invalid cidr '10.0.0.300/8'"),
    ("version: 1\nnetwork:\n  allow:\n    - cidr: 10.0.0.1/8\n", 4, "invalid cidr '10.0.0.1/8'"),
    ("version: 1\nnetwork:\n  allow:\n    - cidr: 0.0.0.0/0\n", 4, "covers every address"),
    ("version: 1\nnetwork:\n  allow:\n    - cidr: \"::ffff:10.0.0.0/104\"\n", 4, "write IPv4-mapped ranges as plain IPv4"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: [0]\n", 5, "invalid port 0"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: [65536]\n", 5, "invalid port 65536"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports:\n        - 443\n        - http\n", 7, "invalid port 'http'"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: []\n", 5, "'ports' is empty"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: true\n", 5, "'ports' must be a list"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      port: [443]\n", 5, "unknown key 'port' in entry"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      cidr: 1.2.3.0/24\n", 4, "exactly one of 'host' or 'cidr'"),
    ("version: 1\nnetwork:\n  allow:\n    - ports: [443]\n", 4, "exactly one of 'host' or 'cidr'"),
    ("version: 1\nnetwork:\n  allow:\n    - host: 42\n", 4, "'host' must be a string"),
    ("version: 1\nnetwork:\n  allow:\n    - 42\n", 4, "an entry must be a host string or a mapping"),
    ("version: 1\nnetwork:\n  deny:\n    - \"*\"\n", 4, "would match every host"),
    ("version: 1\nnetwork:\n  ask:\n    - \"bad host\"\n", 4, "invalid host 'bad host'"),
    ("version: 1\nnetwork:\n  resolver: 8.8.8.8:99999\n", 3, "invalid port in '8.8.8.8:99999'"),
    ("version: 1\nnetwork:\n  resolver: dns.example\n", 3, "must be an IP address"),
    ("version: 1\nnetwork:\n  resolver: 53\n", 3, "'resolver' must be a string"),
    ("version: 1\ninclude: [nosuchlist]\n", 2, "unknown allowlist 'nosuchlist'"),
    ("version: 1\ninclude: 7\n", 2, "'include' must be a list"),
    ("version: 1\nversion: 1\n", 2, "duplicate key 'version'"),
    ("version: 1\nnetwork:\n  allow: [a.org\n", 4, "invalid YAML"),
    ("- a\n- b\n", 1, "must be a YAML mapping"),
]


@pytest.mark.parametrize("text,line,fragment", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_policy_names_file_line_and_problem(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    msg = error_of(tmp_path, text)
    assert msg.startswith(f"{tmp_path / 'policy.yaml'}:{line}: "), msg
    assert fragment in msg, msg


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    assert "empty policy" in error_of(tmp_path, "")
    with pytest.raises(PolicyFileError, match="no such file"):
        build_policy([tmp_path / "nope.yaml"], [], [])


def test_error_in_included_file_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\nnetwork:\n  allow:\n    - \"*\"\n", "inner.yaml")
    msg = error_of(tmp_path, "version: 1\ninclude: [./inner.yaml]\n")
    assert msg.startswith(f"{tmp_path / 'inner.yaml'}:4: "), msg


def test_include_cycle_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\ninclude: [./b.yaml]\n", "a.yaml")
    write(tmp_path, "version: 1\ninclude: [./a.yaml]\n", "b.yaml")
    with pytest.raises(PolicyFileError, match="include cycle"):
        build_policy([tmp_path / "a.yaml"], [], [])


def test_two_resolvers_conflict(tmp_path: Path) -> None:
    a = write(tmp_path, "version: 1\nnetwork:\n  resolver: 192.0.2.1\n", "a.yaml")
    b = write(tmp_path, "version: 1\nnetwork:\n  resolver: 192.0.2.2:5353\n", "b.yaml")
    with pytest.raises(PolicyFileError, match="two different resolvers"):
        build_policy([a, b], [], [])


def test_good_policy_rules_and_origins(tmp_path: Path) -> None:
    pol = load(tmp_path, """\
version: 1
description: demo
include: [pypi]
network:
  allow:
    - Example.ORG.
    - host: "*.pythonhosted.org"
      ports: [443]
    - cidr: 203.0.113.0/24
      ports: [8080]
    - 198.51.100.7
  deny:
    - "*.evil.test"
  ask: []
  resolver: "[2001:db8::1]:5353"
""").network
    allow = {(r.kind, str(r.value)): r for r in pol.allow}
    assert allow[("host", "example.org")].ports == DEFAULT_ALLOW_PORTS
    assert allow[("host", "example.org")].origin.endswith("policy.yaml:6")
    assert allow[("wildcard", "pythonhosted.org")].ports == {443}
    assert allow[("cidr", "203.0.113.0/24")].ports == {8080}
    assert allow[("cidr", "198.51.100.7/32")].kind == "cidr"
    assert allow[("host", "pypi.org")].origin == "allowlists/pypi.yaml:" + allow[("host", "pypi.org")].origin.split(":")[-1]
    assert [(r.kind, r.value, r.ports) for r in pol.deny] == [("wildcard", "evil.test", None)]
    assert pol.resolver == ("2001:db8::1", 5353)


def test_command_line_entries() -> None:
    pol = build_policy([], ["pypi", "mirror.test:8443", "203.0.113.0/24:8080"], ["files.pythonhosted.org"]).network
    kinds = {(r.kind, str(r.value), tuple(sorted(r.ports or ()))) for r in pol.allow}
    assert ("host", "mirror.test", (8443,)) in kinds
    assert ("cidr", str(ipaddress.ip_network("203.0.113.0/24")), (8080,)) in kinds
    assert pol.deny[0].value == "files.pythonhosted.org" and pol.deny[0].ports is None
    with pytest.raises(PolicyFileError, match="neither a bundled allowlist"):
        build_policy([], ["pypy"], [])
    with pytest.raises(PolicyFileError, match="invalid port"):
        build_policy([], ["a.test:https"], [])


def test_every_bundled_allowlist_loads_with_commented_hosts() -> None:
    names = bundled_names()
    for required in ("pypi", "npm", "crates", "github", "golang", "rubygems", "maven", "debian", "ubuntu",
                     "conda", "huggingface", "docker-hub"):
        assert required in names
    for name, desc, count in describe_bundled():
        assert desc and count > 0, name
        pol = build_policy([], [name], []).network
        assert pol.allow and not pol.deny
        text = (REPO / "allowlists" / f"{name}.yaml").read_text().splitlines()
        for rule in pol.allow:
            line = text[int(rule.origin.rsplit(":", 1)[1]) - 1]
            assert "#" in line, f"{name}: host without a comment: {line!r}"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_cli_reports_policy_error_in_one_line_exit_125(tmp_path: Path) -> None:
    p = write(tmp_path, "version: 1\nnetwork:\n  allow:\n    - \"*\"\n")
    r = run_cli("proxy", "--policy", str(p), "--listen", "127.0.0.1:1")
    assert r.returncode == 125
    assert r.stderr.strip().splitlines() == [f"sandgate: error: {p}:4: '*' would match every host; list the hosts instead"]
    assert "Traceback" not in r.stderr


def test_cli_usage_errors_exit_125(tmp_path: Path) -> None:
    r = run_cli("proxy", cwd=tmp_path)
    assert r.returncode == 125 and "sandgate: error: no policy" in r.stderr
    r = run_cli("proxy", "--allow", "pypi", "--listen", "127.0.0.1:notaport", cwd=tmp_path)
    assert r.returncode == 125 and "invalid address '127.0.0.1:notaport'" in r.stderr
    r = run_cli("frobnicate")
    assert r.returncode == 125 and "sandgate: error:" in r.stderr


def test_cli_allowlists_lists_every_bundled_list() -> None:
    r = run_cli("allowlists")
    assert r.returncode == 0
    for name in bundled_names():
        assert any(line.startswith(name + " ") for line in r.stdout.splitlines()), name


def test_the_parsed_document_cache_gives_back_the_same_document_with_its_lines(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher import policy as lp
    text = "version: 1\nnetwork:\n  allow:\n    - a.test\n    - {host: b.test, ports: [8443]}\n"
    monkeypatch.setattr(lp, "CACHE_DIR", None)
    fresh = lp.parse_yaml(text, "p.yaml")
    monkeypatch.setattr(lp, "CACHE_DIR", tmp_path / "cache")
    lp.parse_yaml(text, "p.yaml")  # fills the cache
    (entry,) = (tmp_path / "cache").iterdir()
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700 and entry.stat().st_mode & 0o777 == 0o600
    cached = lp.parse_yaml(text, "p.yaml")
    assert cached == fresh
    allow, fallow = cached["network"]["allow"], fresh["network"]["allow"]
    assert (cached.lines, allow.lines, allow[1].lines) == (fresh.lines, fallow.lines, fallow[1].lines)
    assert isinstance(allow, lp.LocList) and isinstance(allow[1], lp.LocDict)


def test_a_damaged_cache_entry_is_a_miss_and_odd_types_are_never_cached(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher import policy as lp
    monkeypatch.setattr(lp, "CACHE_DIR", tmp_path)
    text = "version: 1\nnetwork:\n  allow: [a.test]\n"
    lp.parse_yaml(text, "p.yaml")
    (entry,) = tmp_path.iterdir()
    entry.write_text('{"m": [["version", 1')  # truncated
    assert lp.parse_yaml(text, "p.yaml")["network"]["allow"] == ["a.test"]
    entry.unlink()
    lp.parse_yaml("version: 1\ndescription: 2026-12-01\n", "d.yaml")  # a YAML timestamp
    assert not list(tmp_path.glob("*.json"))

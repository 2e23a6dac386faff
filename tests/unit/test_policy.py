"""Policy files: every user mistake is one message naming FILE:LINE; good files give the right rules."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import hostilefile, trust
from launcher.config.bundled import bundled_names, describe_bundled
from launcher.config.checks import Checks
from launcher.config.errors import PolicyFileError
from launcher.config.load import Policy, build_policy
from launcher.errors import UsageError
from netguard.policy import DEFAULT_ALLOW_PORTS

REPO = Path(__file__).resolve().parent.parent.parent


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def load(tmp_path: Path, text: str) -> Policy:
    return build_policy([write(tmp_path, text)], [], [])


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(PolicyFileError) as e:
        load(tmp_path, text)
    return str(e.value)


BAD = [
    # (policy text, expected line, fragment of the message)
    ("network: {}\n", 1, "missing 'version: 1'"),
    ("version: 2\n", 1, "unsupported version 2"),
    ("version: true\n", 1, "unsupported version; this sandgate reads version 1"),
    ("version: 1\nnetwrok: {}\n", 2, "unknown key 'netwrok'"),
    ("version: 1\nnetwork:\n  alow: []\n", 3, "unknown key 'network.alow'"),
    ("version: 1\nnetwork: [a]\n", 2, "'network' must be a mapping"),
    ("version: 1\nnetwork:\n  allow: pypi.org\n", 3, "'network.allow' must be a list"),
    ('version: 1\nnetwork:\n  allow:\n    - "*"\n', 4, "would match every host"),
    ('version: 1\nnetwork:\n  allow:\n    - "*."\n', 4, "would match every host"),
    ('version: 1\nnetwork:\n  allow:\n    - "*..org"\n', 4, "empty label after '*.'"),
    ('version: 1\nnetwork:\n  allow:\n    - "a.*.org"\n', 4, "'*' is only allowed as the whole first label"),
    ('version: 1\nnetwork:\n  allow:\n    - "*foo.org"\n', 4, "'*' is only allowed"),
    ('version: 1\nnetwork:\n  allow:\n    - "a..b"\n', 4, "invalid host 'a..b'"),
    ('version: 1\nnetwork:\n  allow:\n    - "*.10.0.0.1"\n', 4, "a wildcard cannot cover an IP address"),
    ("version: 1\nnetwork:\n  allow:\n    - ok.org\n    - cidr: 10.0.0.300/8\n", 5, "invalid cidr '10.0.0.300/8'"),
    ("version: 1\nnetwork:\n  allow:\n    - cidr: 10.0.0.1/8\n", 4, "invalid cidr '10.0.0.1/8'"),
    ("version: 1\nnetwork:\n  allow:\n    - cidr: 0.0.0.0/0\n", 4, "covers every address"),
    (
        'version: 1\nnetwork:\n  allow:\n    - cidr: "::ffff:10.0.0.0/104"\n',
        4,
        "write IPv4-mapped ranges as plain IPv4",
    ),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: [0]\n", 5, "invalid port 0"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: [65536]\n", 5, "invalid port 65536"),
    (
        "version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports:\n        - 443\n        - http\n",
        7,
        "invalid port 'http'",
    ),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: []\n", 5, "'ports' is empty"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      ports: true\n", 5, "'ports' must be a list"),
    ("version: 1\nnetwork:\n  allow:\n    - host: a.org\n      port: [443]\n", 5, "unknown key 'port' in entry"),
    (
        "version: 1\nnetwork:\n  allow:\n    - host: a.org\n      cidr: 1.2.3.0/24\n",
        4,
        "exactly one of 'host' or 'cidr'",
    ),
    ("version: 1\nnetwork:\n  allow:\n    - ports: [443]\n", 4, "exactly one of 'host' or 'cidr'"),
    ("version: 1\nnetwork:\n  allow:\n    - host: 42\n", 4, "'host' must be a string"),
    ("version: 1\nnetwork:\n  allow:\n    - 42\n", 4, "an entry must be a host string or a mapping"),
    ('version: 1\nnetwork:\n  deny:\n    - "*"\n', 4, "would match every host"),
    ('version: 1\nnetwork:\n  ask:\n    - "bad host"\n', 4, "invalid host 'bad host'"),
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
    write(tmp_path, 'version: 1\nnetwork:\n  allow:\n    - "*"\n', "inner.yaml")
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
    pol = load(
        tmp_path,
        """\
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
""",
    ).network
    allow = {(r.kind, str(r.value)): r for r in pol.allow}
    assert allow[("host", "example.org")].ports == DEFAULT_ALLOW_PORTS
    assert str(allow[("host", "example.org")].origin).endswith("policy.yaml:6")
    assert allow[("wildcard", "pythonhosted.org")].ports == frozenset({443})
    assert allow[("cidr", "203.0.113.0/24")].ports == frozenset({8080})
    assert allow[("cidr", "198.51.100.7/32")].kind == "cidr"
    assert (
        allow[("host", "pypi.org")].origin.path == "allowlists/pypi.yaml"
        and allow[("host", "pypi.org")].origin.line is not None
    )
    assert [(r.kind, r.value, r.ports) for r in pol.deny] == [("wildcard", "evil.test", None)]
    assert pol.resolver == ("2001:db8::1", 5353)


def test_command_line_entries() -> None:
    pol = build_policy([], ["pypi", "mirror.test:8443", "203.0.113.0/24:8080"], ["files.pythonhosted.org"]).network
    kinds = {(r.kind, str(r.value), tuple(sorted(r.ports or ()))) for r in pol.allow}
    assert ("host", "mirror.test", (8443,)) in kinds
    assert ("cidr", str(ipaddress.ip_network("203.0.113.0/24")), (8080,)) in kinds
    assert pol.deny[0].value == "files.pythonhosted.org" and pol.deny[0].ports is None
    with pytest.raises(UsageError, match="no bundled list 'pypy'; did you mean 'pypi'"):
        build_policy([], ["pypy"], [])
    with pytest.raises(PolicyFileError, match="invalid port"):
        build_policy([], ["a.test:https"], [])


def test_every_bundled_allowlist_loads_with_commented_hosts() -> None:
    names = bundled_names()
    for required in (
        "pypi",
        "npm",
        "crates",
        "github",
        "golang",
        "rubygems",
        "maven",
        "debian",
        "ubuntu",
        "conda",
        "huggingface",
        "docker-hub",
        "github-readonly",
        "npm-readonly",
        "pypi-readonly",
        "anthropic",
        "openai",
    ):
        assert required in names
    for name, desc, count in describe_bundled():
        assert desc and count > 0, name
        pol = build_policy([], [name], []).network
        assert pol.allow and (not pol.deny or name.endswith("-readonly"))  # presets may deny a write host
        text = (REPO / "allowlists" / f"{name}.yaml").read_text().splitlines()
        for rule in pol.allow:
            line = text[(rule.origin.line or 0) - 1]
            assert "#" in line, f"{name}: host without a comment: {line!r}"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_cli_reports_policy_error_in_one_line_exit_125(tmp_path: Path) -> None:
    p = write(tmp_path, 'version: 1\nnetwork:\n  allow:\n    - "*"\n')
    r = run_cli("proxy", "--policy", str(p), "--listen", "127.0.0.1:1")
    assert r.returncode == 125
    assert r.stderr.strip().splitlines() == [
        f"sandgate: error: {p}:4: '*' would match every host; list the hosts instead"
    ]
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


def test_the_parsed_document_cache_gives_back_the_same_document_with_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.config import locs, parsecache
    from launcher.config import yamlfile as lp

    text = "version: 1\nnetwork:\n  allow:\n    - a.test\n    - {host: b.test, ports: [8443]}\n"
    monkeypatch.setattr(parsecache, "CACHE_DIR", None)
    fresh = lp.parse_yaml(text, "p.yaml")
    monkeypatch.setattr(parsecache, "CACHE_DIR", tmp_path / "cache")
    build_policy([write(tmp_path, text)], [], [])  # a validated policy fills the cache
    (entry,) = (tmp_path / "cache").iterdir()
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700 and entry.stat().st_mode & 0o777 == 0o600
    cached = lp.parse_yaml(text, "p.yaml")
    assert cached == fresh
    allow, fallow = cached["network"]["allow"], fresh["network"]["allow"]
    assert (cached.lines, allow.lines, allow[1].lines) == (fresh.lines, fallow.lines, fallow[1].lines)
    assert isinstance(allow, locs.LocList) and isinstance(allow[1], locs.LocDict)


def test_a_damaged_cache_entry_is_a_miss_and_odd_types_are_never_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.config import parsecache
    from launcher.config import yamlfile as lp

    monkeypatch.setattr(parsecache, "CACHE_DIR", tmp_path / "cache")
    text = "version: 1\nnetwork:\n  allow: [a.test]\n"
    build_policy([write(tmp_path, text)], [], [])
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text('{"m": [["version", 1')  # truncated
    assert lp.parse_yaml(text, "p.yaml")["network"]["allow"] == ["a.test"]
    entry.unlink()
    build_policy([write(tmp_path, "version: 1\ndescription: 2026-12-01\n", "d.yaml")], [], [])  # a YAML timestamp
    assert not list((tmp_path / "cache").glob("*.json"))


# ---- checks every policy is held to: absurd cidrs, writable homes, sizes --------------------------


def allow_cidrs(tmp_path: Path, *cidrs: str, key: str = "allow") -> Path:
    return write(tmp_path, "version: 1\nnetwork:\n  " + key + ":\n" + "".join(f'    - cidr: "{c}"\n' for c in cidrs))


@pytest.mark.parametrize(
    "cidrs,line,fragment",
    [
        (("0.0.0.0/1", "128.0.0.0/1"), 4, "network.allow: cidr 0.0.0.0/1 covers 1/2 of all IPv4 addresses"),
        (("192.0.2.0/24", "10.0.0.0/7"), 5, "cidr 10.0.0.0/7 covers 1/128 of all IPv4"),
        (("2000::/3",), 4, "cidr 2000::/3 covers 1/8 of all IPv6 addresses (one rule may cover at most a /16)"),
        # The class, not the example: 256 /8s would be the whole internet too. Four is the most.
        (
            ("10.0.0.0/8", "11.0.0.0/8", "12.0.0.0/8", "12.0.0.0/9", "13.0.0.0/8", "14.0.0.0/8", "15.0.0.0/8"),
            9,
            "with cidr 14.0.0.0/8, the cidr rules cover 1/51 of all IPv4 addresses, more than four /8s",
        ),
        (("2001::/16", "2002::/16", "2003::/16", "2004::/16", "2005::/16"), 8, "more than four /16s"),
    ],
    ids=["two-halves", "a-/7", "ipv6-/3", "five-/8s", "five-ipv6-/16s"],
)
def test_wide_cidrs_are_refused_in_every_policy_unless_the_flag_says_so(
    tmp_path: Path, cidrs: tuple[str, ...], line: int, fragment: str
) -> None:
    p = allow_cidrs(tmp_path, *cidrs)
    with pytest.raises(PolicyFileError) as e:
        build_policy([p], [], [], checks=Checks())
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert fragment in msg and msg.endswith("pass --allow-wide-cidr to sandgate if you mean it"), msg
    pol = build_policy([p], [], [], checks=Checks(allow_wide_cidr=True))
    assert len(pol.network.allow) == len(cidrs)


def test_wide_cidr_limits_cover_ask_and_the_command_line_but_not_deny(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match=r"network.ask: cidr 0.0.0.0/1"):
        build_policy([allow_cidrs(tmp_path, "0.0.0.0/1", key="ask")], [], [], checks=Checks())
    with pytest.raises(PolicyFileError, match=r"^command line: network.allow: cidr 128.0.0.0/1 covers 1/2"):
        build_policy([], ["128.0.0.0/1"], [], checks=Checks())
    build_policy([], ["128.0.0.0/1"], [], checks=Checks(allow_wide_cidr=True))
    # Deny rules only narrow; a /8 and four /8s in all are still fine.
    build_policy([allow_cidrs(tmp_path, "0.0.0.0/1", "::/1", key="deny")], [], [], checks=Checks())
    build_policy(
        [allow_cidrs(tmp_path, "10.0.0.0/8", "11.0.0.0/8", "12.0.0.0/8", "13.0.0.0/8", "13.1.0.0/16")],
        [],
        [],
        checks=Checks(),
    )


HOME_CHECKS = Checks(homes=("/home/u",), cwd="/srv/ws")


@pytest.mark.parametrize(
    "entry,ok",
    [
        ("~", False),
        ("~/", False),
        ("/home", False),
        ("/home/u", False),
        ("/home/u/", False),
        ("~/.cache/pip", True),
        ("/home/u/proj", True),
        ("/home/u2", True),
        (".", True),
        ("build", True),
        ("/srv", True),
    ],
)
def test_writable_roots_at_or_above_home_are_refused(tmp_path: Path, entry: str, ok: bool) -> None:
    p = write(tmp_path, f'version: 1\nfilesystem:\n  write:\n    - /tmp\n    - "{entry}"\n')
    if ok:
        assert build_policy([p], [], [], checks=HOME_CHECKS).filesystem.write == ("/tmp", entry)
        return
    with pytest.raises(PolicyFileError) as e:
        build_policy([p], [], [], checks=HOME_CHECKS)
    msg = str(e.value)
    assert msg.startswith(f"{p}:5: 'filesystem.write' entry '{entry}' is "), msg
    assert "(/home/u)" in msg and "name the project directories it must write instead" in msg


def test_writable_root_checks_see_through_symlinks_and_the_workspace(tmp_path: Path) -> None:
    p = write(tmp_path, "version: 1\nfilesystem:\n  write: [/data/link]\n")
    links = Checks(homes=("/home/u",), cwd="/srv", realpath=lambda x: "/home" if x == "/data/link" else x)
    with pytest.raises(PolicyFileError, match="'/data/link' is a directory that holds your home"):
        build_policy([p], [], [], checks=links)
    dot = write(tmp_path, "version: 1\nfilesystem:\n  write: [.]\n", "dot.yaml")
    with pytest.raises(PolicyFileError, match=r"entry '.' is your home directory"):
        build_policy([dot], [], [], checks=Checks(homes=("/home/u",), cwd="/home/u"))
    with pytest.raises(PolicyFileError, match="is the whole filesystem"):  # fsguard's own check, first
        build_policy([write(tmp_path, "version: 1\nfilesystem:\n  write: [/]\n")], [], [], checks=HOME_CHECKS)


def test_checks_of_a_run_know_every_home_tilde_may_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    monkeypatch.setenv("HOME", "/nonexistent/fake-home")
    homes = Checks.current(user="nobody").homes
    assert "/nonexistent/fake-home" in homes and pwd.getpwuid(os.geteuid()).pw_dir in homes
    assert pwd.getpwnam("nobody").pw_dir in homes and not Checks.current().allow_wide_cidr


def test_too_many_rules_and_files_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.config import checks

    monkeypatch.setattr(checks, "MAX_RULES", 10_000)  # the real bound is 1,000,000: the same check, smaller
    hosts = "".join(f"    - h{i}.test\n" for i in range(10_001))
    p = write(tmp_path, "version: 1\nnetwork:\n  allow:\n" + hosts)
    with pytest.raises(PolicyFileError, match=rf"^{p}:10004: more than 10000 network rules in all"):
        build_policy([p], [], [], checks=Checks())
    for i in range(70):
        write(tmp_path, f"version: 1\nnetwork:\n  allow: [f{i}.test]\n", f"f{i}.yaml")
    fan = write(tmp_path, "version: 1\ninclude:\n" + "".join(f"  - ./f{i}.yaml\n" for i in range(70)), "fan.yaml")
    with pytest.raises(PolicyFileError, match="more than 64 files in one policy"):
        build_policy([fan], [], [], checks=Checks())


def test_a_file_included_twice_is_read_once_and_deep_include_chains_stop(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\nnetwork:\n  allow: [d.test]\n", "d.yaml")
    write(tmp_path, "version: 1\ninclude: [./d.yaml, pypi]\n", "b.yaml")
    write(tmp_path, "version: 1\ninclude: [./d.yaml, pypi]\n", "c.yaml")
    pol = build_policy([write(tmp_path, "version: 1\ninclude: [./b.yaml, ./c.yaml]\n", "a.yaml")], [], [])
    assert [r.value for r in pol.network.allow].count("d.test") == 1
    assert [r.value for r in pol.network.allow].count("pypi.org") == 1
    for i in range(20):
        write(tmp_path, f"version: 1\ninclude: [./chain{i + 1}.yaml]\n", f"chain{i}.yaml")
    with pytest.raises(PolicyFileError, match="includes nested deeper than 16"):
        build_policy([tmp_path / "chain0.yaml"], [], [])


# ---- hostile input: only regular files, bounded, and no message quotes a file that is not a policy --


def hostile_files(tmp_path: Path) -> dict[str, Path]:
    """Each kind of hostile input, made here (nothing is read from the host but /dev/zero and /proc)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "dir.yaml").mkdir()
    big = write(tmp_path, 'version: 1\ndescription: "' + "a" * (17 << 20) + '"\n', "big.yaml")
    deep = write(tmp_path, "version: 1\nx: " + "[" * 50_000 + "]" * 50_000 + "\n", "deep.yaml")
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")  # a symlink is followed: the target must be a regular file
    return {
        "fifo": fifo,
        "directory": tmp_path / "dir.yaml",
        "17 MiB": big,
        "50000 nested lists": deep,
        "/dev/zero": Path("/dev/zero"),
        "symlink to /dev/zero": tmp_path / "zero.yaml",
        "/proc file": Path("/proc/self/status"),
    }


HOSTILE_MESSAGES = {
    "fifo": "not a regular file (a FIFO)",
    "directory": "not a regular file (a directory)",
    "17 MiB": "larger than 16 MiB",
    "50000 nested lists": ":2: nested deeper than 32 levels",
    "/dev/zero": "not a regular file (a device)",
    "symlink to /dev/zero": "not a regular file (a device)",
    "/proc file": "a /proc or /sys file, not a policy",
}


def test_hostile_files_are_refused_before_reading_with_one_clear_line(tmp_path: Path) -> None:
    for name, path in hostile_files(tmp_path).items():
        with pytest.raises(PolicyFileError) as e:
            build_policy([path], [], [])
        assert str(e.value).startswith(str(path)) and HOSTILE_MESSAGES[name] in str(e.value), (name, str(e.value))
        # ... and as an include: reported at the include line of the file that names it
        inc = write(tmp_path, f"version: 1\ninclude:\n  - {path}\n", "inc.yaml")
        with pytest.raises(PolicyFileError) as e:
            build_policy([inc], [], [])
        assert str(e.value).startswith(f"{inc}:3: include '{path}' "), (name, str(e.value))


@pytest.mark.parametrize("name", list(HOSTILE_MESSAGES))
def test_cli_hostile_input_is_one_error_line_exit_125(tmp_path: Path, name: str) -> None:
    path = hostile_files(tmp_path)[name]
    for policy in (path, write(tmp_path, f"version: 1\ninclude: [{path}]\n", "inc.yaml")):
        r = run_cli("proxy", "--policy", str(policy), "--listen", "127.0.0.1:1")
        assert r.returncode == 125, (name, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("sandgate: error: "), (name, r.stderr)


SECRET_FILES = {
    # shadow-like: a valid YAML mapping whose keys are the secret lines (v1 quoted the first one)
    "shadow": "root:$6$SALTSECRET$HASHSECRETvalue:19000:0:99999:7:::\nalice:$y$j9T$OTHERHASHSECRET:19000:0:99999:7:::\n",
    "invalid YAML with a tab": "password: hunter2secret\n\tapi_key: sk-TABSECRET\n",
    "an undefined alias": "token: *ALIASSECRET\n",
    "an unknown tag": "token: !TAGSECRET value\n",
    "a bad escape": 'token: "SECRET\\qESCAPE"\n',
    "a version that is a secret": "version: VERSIONSECRET\nnetwork: {}\n",
    "a duplicate secret key": "version: 1\nDUPSECRET: 1\nDUPSECRET: 2\n",
    "a control character": "token: CTRLSECRET\x01\n",
}


def secret_words(text: str) -> set[str]:
    return {
        w
        for line in text.splitlines()
        for w in (line, line[:-1], *line.replace("$", ":").split(":"))
        if "SECRET" in w.upper() or len(w) >= 12
    }


@pytest.mark.parametrize("kind", list(SECRET_FILES))
def test_errors_never_quote_a_file_that_is_not_a_policy(tmp_path: Path, kind: str) -> None:
    secret = write(tmp_path, SECRET_FILES[kind], "creds")
    for policy in (secret, write(tmp_path, f"version: 1\ninclude: [{secret}]\n", "p.yaml")):
        with pytest.raises(PolicyFileError) as e:
            build_policy([policy], [], [])
        msg = str(e.value)
        assert not [w for w in secret_words(SECRET_FILES[kind]) if w in msg], msg
    assert "is not a sandgate policy (" in msg, msg


def test_include_of_etc_shadow_quotes_none_of_it(tmp_path: Path) -> None:
    shadow = Path("/etc/shadow")
    assert shadow.is_file(), "the tests run as root on a Linux machine"
    lines = [x for x in shadow.read_text().splitlines() if x.strip()]
    p = write(tmp_path, "version: 1\ninclude: [/etc/shadow]\n")
    for args in (["--policy", str(p)], ["--policy", str(shadow)]):
        r = run_cli("proxy", *args, "--listen", "127.0.0.1:1")
        assert r.returncode == 125 and len(r.stderr.splitlines()) == 1, r.stderr
        leaked = [x for x in lines for piece in (x, x[:-1], x.split(":")[1]) if len(piece) > 3 and piece in r.stderr]
        assert not leaked, r.stderr
    assert r.stderr.startswith("sandgate: error: /etc/shadow"), r.stderr
    r = run_cli("proxy", "--policy", str(p), "--listen", "127.0.0.1:1")
    assert r.stderr.strip() == (
        f"sandgate: error: {p}:2: include '/etc/shadow' is not a sandgate policy (no 'version: 1' at line 1)"
    )


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("version: 1\nx: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n", ":2: nested deeper than 32 levels"),
        (
            "version: 1\n"
            + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9)),
            "more than 1000000 values (an alias counts each time it is used)",
        ),
        ("version: 1\nx: &r [*r]\n", "an alias inside the collection it names"),
        (
            "version: 1\nnetwork:\n  allow:\n    - {host: a.test, ports: [" + "9" * 5000 + "]}\n",
            ":4: invalid YAML: a value",
        ),
        ("version: 1\ndescription: 2026-13-45\n", ":2: invalid YAML: a value that cannot be read"),
        ("version: 1\n? [a, b]\n: c\n", ":2: invalid YAML: a mapping key must be a plain value"),
        ("version: 1\n---\nversion: 1\n", "more than one YAML document"),
    ],
    ids=["deep-mappings", "alias-bomb", "recursive-alias", "huge-int", "bad-date", "unhashable-key", "two-docs"],
)
def test_yaml_that_would_hang_crash_or_blow_up_is_one_clear_error(tmp_path: Path, text: str, fragment: str) -> None:
    assert fragment in error_of(tmp_path, text)


def test_messages_from_a_policy_never_carry_control_characters_or_run_long(tmp_path: Path) -> None:
    msg = error_of(tmp_path, 'version: 1\nnetwork:\n  allow:\n    - "evil\\e]0;title\\a\\nline2\\u202e"\n')
    assert "\\x1b" in msg and "\\x0a" in msg and "\\u202e" in msg
    assert not any(ord(c) < 32 or c == "\u202e" for c in msg), repr(msg)
    msg = error_of(tmp_path, 'version: 1\nnetwork:\n  allow:\n    - "' + "bad host " * 5000 + '"\n')
    assert len(msg) <= 600 and msg.endswith("…")


def test_limits_are_checked_before_a_document_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.config import parsecache
    from launcher.config import yamlfile as lp

    monkeypatch.setattr(parsecache, "CACHE_DIR", tmp_path / "cache")
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9)
    )
    with pytest.raises(PolicyFileError, match="more than 1000000 values"):
        lp.parse_yaml(bomb, "bomb.yaml")
    assert not list((tmp_path / "cache").glob("*.json")) if (tmp_path / "cache").exists() else True
    text = "version: 1\nnetwork:\n  allow: [a.test]\n"
    (tmp_path / "cache").mkdir(exist_ok=True)
    deep = '{"s": ' * 100_000 + "}" * 100_000
    (tmp_path / "cache" / f"{hostilefile.digest(text.encode())}{parsecache.SUFFIX}").write_text(deep)
    assert lp.parse_yaml(text, "p.yaml")["network"]["allow"] == ["a.test"]  # a deep damaged entry is a miss


# ---- the workspace policy: narrows until trusted ----------------------------------------------------

HOSTILE_WORKSPACE = """\
version: 1
include: [pypi, ./more.yaml]
network:
  allow:
    - cidr: 0.0.0.0/1
    - cidr: 128.0.0.0/1
  ask: [ask.test]
  deny: [evil.test]
  resolver: 192.0.2.53
filesystem:
  write: ["~"]
  read_deny: [secrets/]
  protect: [notes.txt, /etc/nologin, ~/.bashrc]
env:
  keep: ["*"]
  drop: [PROJECT_*]
"""


def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> tuple[Path, trust.Store]:
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    (ws / ".sandgate.yaml").write_text(text)
    return Path(".sandgate.yaml"), trust.Store(tmp_path / "state")


def test_an_untrusted_workspace_policy_only_narrows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, store = workspace(tmp_path, monkeypatch, HOSTILE_WORKSPACE)
    pol = build_policy(
        [], [], [], workspace=path, store=store, checks=Checks(homes=(str(tmp_path),), cwd=str(tmp_path))
    )
    assert not pol.network.allow and not pol.network.ask and pol.network.resolver is None
    assert [(r.value, str(r.origin)) for r in pol.network.deny] == [("evil.test", ".sandgate.yaml:8")]
    assert pol.filesystem.write is None and pol.filesystem.read_deny == ("secrets/",)
    assert pol.filesystem.protect == ("notes.txt",)
    assert pol.env.keep == () and pol.env.drop == ("PROJECT_*",)
    assert pol.files == () and pol.sources == (".sandgate.yaml (untrusted: narrowing only)",)
    assert pol.narrowed is not None and pol.narrowed.ignored == (
        "include",
        "network.allow",
        "network.ask",
        "network.resolver",
        "filesystem.write",
        "filesystem.protect outside the workspace",
        "env.keep",
    )
    assert pol.narrowed.notice() == (
        "sandgate: .sandgate.yaml is not trusted, so only what it forbids applies; ignored: include, network.allow, "
        "network.ask, network.resolver, filesystem.write, filesystem.protect outside the workspace, env.keep; "
        "to trust it: sandgate trust .sandgate.yaml"
    )
    assert not (tmp_path / "ws" / "more.yaml").exists()  # its includes are not even read


def test_a_trusted_workspace_policy_applies_in_full_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, store = workspace(tmp_path, monkeypatch, "version: 1\ninclude: [pypi]\nnetwork:\n  allow: [ok.test]\n")
    store.add(__import__("launcher.config.load", fromlist=["x"]).trust_chain(path))
    pol = build_policy([], [], [], workspace=path, store=store)
    assert {"ok.test", "pypi.org"} <= {r.value for r in pol.network.allow}
    assert pol.narrowed is None and pol.files == (path.resolve(),)
    with path.open("a") as f:
        f.write("# an edit\n")
    pol = build_policy([], [], [], workspace=path, store=store)
    assert not pol.network.allow and pol.narrowed is not None and pol.narrowed.status == "changed"
    assert pol.narrowed.notice().startswith("sandgate: .sandgate.yaml changed since you trusted it, so only")


def test_file_includes_of_a_trusted_workspace_policy_must_be_trusted_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.config.load import trust_chain

    path, store = workspace(tmp_path, monkeypatch, "version: 1\ninclude:\n  - ./more.yaml\n")
    more = Path("more.yaml")
    more.write_text("version: 1\nnetwork:\n  allow: [more.test]\n")
    chain = trust_chain(path)
    assert [p.resolve() for p, _ in chain] == [tmp_path / "ws" / ".sandgate.yaml", tmp_path / "ws" / "more.yaml"]
    store.add(chain[:1])  # the top file only: its include was never trusted
    with pytest.raises(
        PolicyFileError,
        match=r"^\.sandgate\.yaml:3: include './more.yaml' is not trusted; review it, "
        r"then run: sandgate trust \.sandgate\.yaml$",
    ):
        build_policy([], [], [], workspace=path, store=store)
    store.add(chain)
    assert [r.value for r in build_policy([], [], [], workspace=path, store=store).network.allow] == ["more.test"]
    more.write_text("version: 1\nnetwork:\n  allow: [other.test]\n")
    with pytest.raises(PolicyFileError, match=r"include './more.yaml' changed since it was trusted"):
        build_policy([], [], [], workspace=path, store=store)


def test_a_trust_list_inside_the_workspace_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.config.load import trust_chain

    path, _ = workspace(tmp_path, monkeypatch, "version: 1\nnetwork:\n  allow: [ok.test]\n")
    inside = trust.Store(tmp_path / "ws" / ".local" / "state" / "sandgate")
    inside.add(trust_chain(path))  # e.g. written by a sandboxed command: the workspace is writable
    pol = build_policy([], [], [], workspace=path, store=inside)
    assert not pol.network.allow and pol.narrowed is not None
    assert "trust records not used: the trust list" in pol.narrowed.notice()


def test_an_explicit_policy_file_may_widen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = workspace(tmp_path, monkeypatch, "version: 1\nnetwork:\n  allow: [ok.test]\nenv:\n  keep: [X]\n")
    pol = build_policy([path], [], [])
    assert [r.value for r in pol.network.allow] == ["ok.test"] and pol.env.keep == ("X",) and pol.narrowed is None


def test_cli_prints_one_line_for_an_untrusted_workspace_policy(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".sandgate.yaml").write_text("version: 1\nnetwork:\n  allow: [a.test]\n  deny: [b.test]\n")
    script = (
        "from launcher import cli; from launcher.run import policyargs; "
        "p = policyargs.policy_from_args(cli.typed_policy(cli.build_parser().parse_args(['proxy']))); "
        "print([r.value for r in p.network.allow], [r.value for r in p.network.deny])"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        cwd=ws,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path / "st")},
    )
    assert r.stdout.strip() == "[] ['b.test']", r.stderr
    assert r.stderr.splitlines() == [
        (
            "sandgate: .sandgate.yaml is not trusted, so only what it forbids applies; "
            "ignored: network.allow; to trust it: sandgate trust .sandgate.yaml"
        )
    ]


@pytest.mark.parametrize(
    "url,host,port",
    [
        ("https://pypi.org/simple", "pypi.org", 443),
        ("http://Example.TEST:8080/x?y#z", "example.test", 8080),
        ("https://user@files.pythonhosted.org/", "files.pythonhosted.org", 443),
        ("ssh://git@github.com/org/repo.git", "github.com", 22),
    ],
)
def test_allow_takes_a_url_as_its_host_and_port(url: str, host: str, port: int) -> None:
    from launcher.config import flags as lp

    (rule,) = lp.flag_entry(url, "allow").allow
    assert (rule.value, rule.ports) == (host, frozenset({port}))


def test_a_url_without_host_or_known_port_is_one_clear_error() -> None:
    from launcher.config import flags as lp

    for bad in ("https:///nohost", "gopher://x.test/"):
        with pytest.raises(PolicyFileError, match="URL needs a host"):
            lp.flag_entry(bad, "allow")
    for bad in ("https://pypi.org:0/", "https://pypi.org:99999/"):  # never silently the scheme's port
        with pytest.raises(PolicyFileError, match="not a usable URL"):
            lp.flag_entry(bad, "allow")


def test_version_and_a_closed_pipe(tmp_path: Path) -> None:
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("sandgate ")
    log = tmp_path / "a.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "ts": "2026-12-01T00:00:00.000Z",
                    "task": "t",
                    "event": "decision",
                    "id": str(i),
                    "kind": "connect",
                    "action": "deny",
                    "would": None,
                    "host": f"h{i}.test",
                    "port": 443,
                    "ip": None,
                    "proto": None,
                    "method": None,
                    "url": None,
                    "qtype": None,
                    "rule": None,
                    "reason": "no allow rule matches",
                }
            )
            + "\n"
            for i in range(3000)
        )
    )
    p = subprocess.run(
        f"{sys.executable} -m launcher.cli audit summary --json {log} | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


def test_listen_addresses_are_taken_apart_by_the_one_host_port_parser() -> None:
    from launcher.cli import parse_addr
    from launcher.errors import UsageError

    assert parse_addr("3128") == ("127.0.0.1", 3128)
    assert parse_addr("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_addr("[::1]:53") == ("::1", 53)
    for bad in ("[::1]", "host:", "host:x", "0", "65536", "::1:3128"):  # a bare IPv6 address has no port
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_addr(bad)


def test_another_users_home_or_a_directory_holding_it_is_refused_too(tmp_path: Path) -> None:
    """Root in /home: the workspace must not be where another user's ~/.bashrc could be planted."""
    checks = Checks(homes=("/root",), cwd="/srv/ws", others=("/home/alice",))
    for entry, what in (("/home", "a directory that holds a user's home"), ("/home/alice", "a user's home directory")):
        p = write(tmp_path, f'version: 1\nfilesystem:\n  write: ["{entry}"]\n')
        with pytest.raises(PolicyFileError, match=rf"is {what} \(/home/alice\)"):
            build_policy([p], [], [], checks=checks)
    p = write(tmp_path, 'version: 1\nfilesystem:\n  write: ["/home/alice-data"]\n')  # a sibling is fine
    assert build_policy([p], [], [], checks=checks).filesystem.write == ("/home/alice-data",)

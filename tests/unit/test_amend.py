"""The "always allow" answer: add_allow edits the policy by lines, keeps the rest, or says it cannot (None)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.config.amend import add_allow, allow_entry
from launcher.config.load import build_policy
from netguard.rules import compile_policy, decide

ENTRY = '{host: "example.org", ports: [443]}'

README_POLICY = """\
version: 1
description: "what this policy is for"      # optional
include: [pypi, npm, ./more.yaml]           # bundled allowlists by name, or paths (relative to this file)
network:
  allow:
    - pypi.org                              # exact host; ports 80 and 443 by default
    - host: "*.pythonhosted.org"            # any subdomain, NOT the apex
      ports: [443]
    - cidr: 203.0.113.0/24                  # address ranges (the only way to allow raw TCP to IPs)
      ports: [8080]
  deny:
    - "*.evil.test"                         # deny always beats allow; no ports = every port
  ask: []                                   # parsed and validated; approvals come later (until then: denied)
  resolver: 192.0.2.53:53                   # optional upstream DNS for the proxy; default: the system's
filesystem:
  write: [".", "/tmp"]                      # writable roots (this is the default; "/tmp" means a private /tmp)
  read_deny: ["~/.pypirc"]                  # hidden, in addition to the defaults
  protect: ["deploy.key", "ci/"]            # read-only, in addition to the defaults; "/" = a directory
env:
  drop: ["NPM_*"]                           # in addition to the defaults
  keep: ["CI_JOB_TOKEN"]                    # exceptions (keep beats drop)
"""

# (name, policy text, host, port, expected text)
AMENDED = [
    (
        "README example: after the multi-line cidr item, before deny",
        README_POLICY,
        "example.org",
        443,
        README_POLICY.replace("      ports: [8080]\n", "      ports: [8080]\n    - " + ENTRY + "\n"),
    ),
    (
        "trailing comments and blank lines after the last item stay after the new one",
        "version: 1\n"
        "network:\n"
        "  allow:\n"
        "    - pypi.org  # the index\n"
        "    # - old.example.net   (disabled)\n"
        "    - files.pythonhosted.org\n"
        "\n"
        "    # add more hosts above\n"
        '  deny: ["*.evil.test"]\n',
        "example.org",
        443,
        "version: 1\n"
        "network:\n"
        "  allow:\n"
        "    - pypi.org  # the index\n"
        "    # - old.example.net   (disabled)\n"
        "    - files.pythonhosted.org\n"
        "    - " + ENTRY + "\n"
        "\n"
        "    # add more hosts above\n"
        '  deny: ["*.evil.test"]\n',
    ),
    (
        "a last item with a block list of ports",
        "version: 1\n"
        "network:\n"
        "  allow:\n"
        "    - host: registry.npmjs.org\n"
        "      ports:\n"
        "        - 443\n"
        "        - 8443   # mirror\n"
        "# end of network\n"
        "env:\n"
        '  drop: ["NPM_*"]\n',
        "example.org",
        443,
        "version: 1\n"
        "network:\n"
        "  allow:\n"
        "    - host: registry.npmjs.org\n"
        "      ports:\n"
        "        - 443\n"
        "        - 8443   # mirror\n"
        "    - " + ENTRY + "\n"
        "# end of network\n"
        "env:\n"
        '  drop: ["NPM_*"]\n',
    ),
    (
        "indentless dashes and 4-space mappings keep their style",
        "version: 1\nnetwork:\n    allow:\n    - 'pypi.org'\n    - \"crates.io\"\n    deny:\n    - evil.test\n",
        "example.org",
        8443,
        "version: 1\n"
        "network:\n"
        "    allow:\n"
        "    - 'pypi.org'\n"
        '    - "crates.io"\n'
        '    - {host: "example.org", ports: [8443]}\n'
        "    deny:\n"
        "    - evil.test\n",
    ),
    (
        "a multi-line last item at the end of a file without a final newline",
        "version: 1\nnetwork:\n  allow:\n    - host: a.example.net\n      ports: [22]",
        "example.org",
        443,
        "version: 1\nnetwork:\n  allow:\n    - host: a.example.net\n      ports: [22]\n    - " + ENTRY,
    ),
    (
        "a flow list with a trailing comment",
        'version: 1\nnetwork:\n  allow: [pypi.org, "*.pythonhosted.org"]   # python\n  deny: []\n',
        "example.org",
        443,
        'version: 1\nnetwork:\n  allow: [pypi.org, "*.pythonhosted.org", ' + ENTRY + "]   # python\n  deny: []\n",
    ),
    (
        "an empty flow list",
        "version: 1\nnetwork:\n  allow: [ ]  # nothing yet\n",
        "example.org",
        443,
        "version: 1\nnetwork:\n  allow: [" + ENTRY + "]  # nothing yet\n",
    ),
    (
        "network without allow: allow becomes its first key, under `network:`",
        'version: 1\nnetwork:   # egress\n  # never these\n  deny:\n    - "*.evil.test"\n  resolver: 192.0.2.53:53\n',
        "example.org",
        443,
        "version: 1\n"
        "network:   # egress\n"
        "  allow:\n"
        "    - " + ENTRY + "\n"
        "  # never these\n"
        "  deny:\n"
        '    - "*.evil.test"\n'
        "  resolver: 192.0.2.53:53\n",
    ),
    (
        "no network section: appended at the end",
        "# my project\nversion: 1\ninclude: [pypi]   # python deps\n\n# that's all\n",
        "example.org",
        443,
        "# my project\nversion: 1\ninclude: [pypi]   # python deps\n\n# that's all\n"
        "network:\n  allow:\n    - " + ENTRY + "\n",
    ),
    (
        "no network section and no final newline",
        'version: 1\nfilesystem:\n  write: ["."]',
        "example.org",
        443,
        'version: 1\nfilesystem:\n  write: ["."]\nnetwork:\n  allow:\n    - ' + ENTRY + "\n",
    ),
    (
        "CRLF line endings are kept",
        "version: 1\r\nnetwork:\r\n  allow:\r\n    - pypi.org\r\n  deny: []\r\n",
        "example.org",
        443,
        "version: 1\r\nnetwork:\r\n  allow:\r\n    - pypi.org\r\n    - " + ENTRY + "\r\n  deny: []\r\n",
    ),
    (
        "CRLF, no network section",
        "version: 1\r\n",
        "example.org",
        443,
        "version: 1\r\nnetwork:\r\n  allow:\r\n    - " + ENTRY + "\r\n",
    ),
    (
        "a byte order mark is kept",
        "\ufeffversion: 1\nnetwork:\n  allow: [a.example.net]\n",
        "example.org",
        443,
        "\ufeffversion: 1\nnetwork:\n  allow: [a.example.net, " + ENTRY + "]\n",
    ),
    (
        "the same host on another port is a new entry",
        "version: 1\nnetwork:\n  allow:\n    - example.org\n",
        "example.org",
        8443,
        'version: 1\nnetwork:\n  allow:\n    - example.org\n    - {host: "example.org", ports: [8443]}\n',
    ),
    (
        "a wildcard does not cover its apex, so the apex is added",
        'version: 1\nnetwork:\n  allow:\n    - "*.example.org"\n',
        "example.org",
        443,
        'version: 1\nnetwork:\n  allow:\n    - "*.example.org"\n    - ' + ENTRY + "\n",
    ),
    (
        "an IP literal host",
        "version: 1\nnetwork:\n  allow: []\n",
        "203.0.113.7",
        5432,
        'version: 1\nnetwork:\n  allow: [{host: "203.0.113.7", ports: [5432]}]\n',
    ),
]

# (name, policy text) that must be refused: the caller prints the entry for the user instead.
REFUSED = [
    ("flow-style network mapping", "version: 1\nnetwork: {allow: [pypi.org]}\n"),
    ("anchor on network", "version: 1\nnetwork: &net\n  allow:\n    - pypi.org\n"),
    ("anchor on allow", "version: 1\nnetwork:\n  allow: &a\n    - pypi.org\n"),
    ("alias as allow", "version: 1\nnetwork:\n  deny: &d [evil.test]\n  allow: *d\n"),
    ("alias as the last item", "version: 1\nnetwork:\n  deny: [&e evil.test]\n  allow:\n    - pypi.org\n    - *e\n"),
    ("tag on allow", "version: 1\nnetwork:\n  allow: !!seq\n    - pypi.org\n"),
    ("tag on network", "version: 1\nnetwork: !!map\n  allow: [pypi.org]\n"),
    ("merge key in network", "version: 1\nbase: &b {allow: [pypi.org]}\nnetwork:\n  <<: *b\n  deny: []\n"),
    ("two documents", "version: 1\nnetwork:\n  allow: [pypi.org]\n---\nversion: 1\n"),
    ("document end marker before the append", "version: 1\n...\n"),
    ("explicit-key network without allow", "version: 1\n? network\n:\n  deny: [evil.test]\n"),
    ("multi-line flow list", "version: 1\nnetwork:\n  allow: [pypi.org,\n          crates.io]\n"),
    ("allow is a string", "version: 1\nnetwork:\n  allow: pypi.org\n"),
    ("allow is a mapping", "version: 1\nnetwork:\n  allow:\n    host: pypi.org\n"),
    ("allow is empty (null)", "version: 1\nnetwork:\n  allow:\n  deny: []\n"),
    ("network is empty (null)", "version: 1\nnetwork:\n# nothing yet\n"),
    ("network is a list", "version: 1\nnetwork:\n  - pypi.org\n"),
    ("duplicate network keys", "version: 1\nnetwork:\n  allow: [a.org]\nnetwork:\n  allow: [b.org]\n"),
    ("a tab in the file", "version: 1\nnetwork:\n  allow:\n    - pypi.org\t# index\n"),
    ("invalid YAML", "version: 1\nnetwork:\n  allow: [pypi.org\n"),
    ("invalid indentation", "version: 1\nnetwork:\n  allow:\n    - a.org\n   - b.org\n"),
    ("empty file", ""),
    ("only comments", "# nothing\n"),
    ("top-level list", "- version: 1\n"),
    ("flow top-level mapping", "{version: 1}\n"),
    ("mixed line endings", "version: 1\r\nnetwork:\n  allow:\n    - a.org\r\n"),
    ("bare CR line endings", "version: 1\rnetwork:\r  allow: [a.org]\r"),
    ("a Unicode line separator", "version: 1 # a\u2028b\nnetwork:\n  allow: [a.org]\n"),
    ("block scalar as the last item", "version: 1\nnetwork:\n  allow:\n    - >\n      a.org\n\n  deny: []\n"),
]

# (name, policy text, host, port): already allowed, so the text comes back unchanged.
ALREADY = [
    ("plain host covers 443 by default", "version: 1\nnetwork:\n  allow:\n    - example.org\n", "example.org", 443),
    ("plain host covers 80 by default", "version: 1\nnetwork:\n  allow: [example.org]\n", "example.org", 80),
    (
        "mapping with the port",
        "version: 1\nnetwork:\n  allow:\n    - host: example.org\n      ports: [22, 8443]\n",
        "example.org",
        8443,
    ),
    ("a single-int ports", "version: 1\nnetwork:\n  allow: [{host: example.org, ports: 8443}]\n", "example.org", 8443),
    ("another spelling of the same host", "version: 1\nnetwork:\n  allow: [Example.ORG.]\n", "example.org", 443),
    (
        "an IP literal as a cidr",
        "version: 1\nnetwork:\n  allow:\n    - cidr: 203.0.113.7/32\n      ports: [5432]\n",
        "203.0.113.7",
        5432,
    ),
    ("even in a shape add_allow would refuse", "version: 1\nnetwork: {allow: [example.org]}\n", "example.org", 443),
]


def loads_and_allows(text: str, host: str, port: int, directory: Path) -> bool:
    """The project's own loader accepts `text` and its rules allow host:port."""
    (directory / "more.yaml").write_text("version: 1\n")
    path = directory / "policy.yaml"
    path.write_bytes(text.encode("utf-8"))
    pol = build_policy([path], [], [])
    probe = "sub." + host[2:] if host.startswith("*.") else host
    return decide(compile_policy(pol.network), probe, port).allowed


@pytest.mark.parametrize(("name", "text", "host", "port", "expected"), AMENDED, ids=[c[0] for c in AMENDED])
def test_amended_text_is_exact(name: str, text: str, host: str, port: int, expected: str, tmp_path: Path) -> None:
    assert add_allow(text, host, port) == expected
    assert loads_and_allows(expected, host, port, tmp_path)
    assert not loads_and_allows(text, host, port, tmp_path)


@pytest.mark.parametrize(("name", "text"), REFUSED, ids=[c[0] for c in REFUSED])
def test_unsafe_shapes_are_refused(name: str, text: str) -> None:
    assert add_allow(text, "example.org", 443) is None


@pytest.mark.parametrize(("name", "text", "host", "port"), ALREADY, ids=[c[0] for c in ALREADY])
def test_already_allowed_is_unchanged(name: str, text: str, host: str, port: int) -> None:
    assert add_allow(text, host, port) is text


@pytest.mark.parametrize(
    "broken",
    [
        "version: 1\nnetwork:\n  allow:\n  - a.org\n - " + ENTRY + "\n",  # does not parse
        "version: 1\nnetwork:\n  allow:\n  - " + ENTRY + "\n",  # lost an entry
        "version: 2\nnetwork:\n  allow:\n  - a.org\n  - " + ENTRY + "\n",  # changed something else
    ],
)
def test_a_wrong_edit_is_never_returned(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last gate: whatever the line edit produced must parse to the old document plus the entry."""
    from launcher.config import amend

    text = "version: 1\nnetwork:\n  allow:\n  - a.org\n"
    good = "version: 1\nnetwork:\n  allow:\n  - a.org\n  - " + ENTRY + "\n"
    assert add_allow(text, "example.org", 443) == good
    monkeypatch.setattr(amend, "_edit", lambda *args: broken)
    assert add_allow(text, "example.org", 443) is None


def test_allow_entry() -> None:
    assert allow_entry("example.org", 443) == ENTRY
    assert allow_entry("*.example.org", 8080) == '{host: "*.example.org", ports: [8080]}'
    assert allow_entry("2001:db8::5", 22) == '{host: "2001:db8::5", ports: [22]}'
    assert yaml.safe_load(allow_entry("example.org", 443)) == {"host": "example.org", "ports": [443]}


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("example.org", 0),
        ("example.org", 65536),
        ("example.org", True),
        ("example.org", "443"),
        ("", 443),
        ("*", 443),
        ("a.*.org", 443),
        ("10.0.0.0/8", 443),
        ("exa\nmple.org", 443),
        ("a..org", 443),
    ],
)
def test_invalid_entries_are_refused(host: str, port: int) -> None:
    with pytest.raises(ValueError):
        allow_entry(host, port)
    with pytest.raises(ValueError):
        add_allow("version: 1\n", host, port)


# ---- property: any generated policy in a supported shape -----------------------------------

HOSTS = st.sampled_from(
    [
        "pypi.org",
        "files.pythonhosted.org",
        "crates.io",
        "*.npmjs.org",
        "github.com",
        "example.org",
        "cdn.example.org",
        "203.0.113.9",
    ]
)
NEW_HOSTS = st.sampled_from(["example.org", "api.example.com", "pypi.org", "198.51.100.4", "*.example.net"])
PORTS = st.sampled_from([22, 80, 443, 8443])
COMMENTS = st.sampled_from(["", "# a comment", "#", "# - disabled.example.net", "#   indented: [x]"])


@st.composite
def block_item(draw: st.DrawFn, dash: str) -> list[str]:
    """One `- ...` item (possibly over several lines), optionally with comments and blank lines before it."""
    pad = " " * len(dash)
    out = []
    for c in draw(st.lists(COMMENTS, max_size=2)):
        out.append((dash[:-2] + c) if c else "")
    host = draw(HOSTS)
    trailing = draw(st.sampled_from(["", "   # why"]))
    style = draw(st.sampled_from(["plain", "quoted", "mapping", "flow-mapping"]))
    if style == "plain" and not host.startswith("*"):
        out.append(f"{dash}{host}{trailing}")
    elif style in ("plain", "quoted"):
        out.append(f'{dash}"{host}"{trailing}')
    elif style == "mapping":
        out.append(f'{dash}host: "{host}"{trailing}')
        ports = draw(st.lists(PORTS, min_size=1, max_size=2, unique=True))
        if draw(st.booleans()):
            out.append(f"{pad}ports: [{', '.join(map(str, ports))}]")
        else:
            out.append(f"{pad}ports:")
            out.extend(f"{pad}  - {p}" for p in ports)
    else:
        out.append(f'{dash}{{host: "{host}", ports: [{draw(PORTS)}]}}{trailing}')
    return out


@st.composite
def policies(draw: st.DrawFn) -> str:
    ind = draw(st.sampled_from([2, 4]))
    sp = " " * ind
    lines = [draw(st.sampled_from(["", "# my project"])), "version: 1"]
    if draw(st.booleans()):
        lines.append('description: "generated"   # for the test')
    if draw(st.booleans()):
        lines.append("include: [pypi]")
    shape = draw(st.sampled_from(["none", "no-allow", "block", "flow"]))
    others = draw(
        st.sampled_from(
            [
                [f"{sp}deny:", f'{sp}{sp}- "*.evil.test"   # never'],
                [f"{sp}# upstream DNS", f"{sp}resolver: 192.0.2.1:53"],
                [f"{sp}ask: []"],
            ]
        )
    )
    others_first = shape == "no-allow" or draw(st.booleans())
    if shape != "none":
        lines.append(draw(st.sampled_from(["network:", "network:   # egress"])))
        if others_first:
            lines.extend(others)
    if shape == "block":
        lines.append(f"{sp}allow:{draw(st.sampled_from(['', '  # hosts']))}")
        dash = draw(st.sampled_from([f"{sp}- ", f"{sp}{sp}- "]))
        for _ in range(draw(st.integers(1, 4))):
            lines.extend(draw(block_item(dash)))
        lines.extend(draw(st.lists(COMMENTS, max_size=3).map(lambda cs: [(dash[:-2] + c) if c else "" for c in cs])))
    elif shape == "flow":
        hosts = draw(st.lists(HOSTS, max_size=4))
        items = ", ".join(f'"{h}"' if h.startswith("*") else h for h in hosts)
        lines.append(f"{sp}allow: [{items}]{draw(st.sampled_from(['', '  # hosts']))}")
    if shape in ("block", "flow") and not others_first:
        lines.extend(others)
    if draw(st.booleans()):
        lines.extend(["filesystem:", f'{sp}write: [".", "/tmp"]'])
    nl = draw(st.sampled_from(["\n", "\r\n"]))
    return nl.join(lines) + draw(st.sampled_from([nl, ""]))


def comments(text: str) -> list[str]:
    """Every comment of `text` (no host or value in these policies contains '#')."""
    return [line[line.index("#") :] for line in text.splitlines() if "#" in line]


def is_subsequence(small: list[str], big: list[str]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


@settings(max_examples=300, deadline=None)
@given(text=policies(), host=NEW_HOSTS, port=PORTS)
def test_generated_policies_gain_exactly_one_entry(text: str, host: str, port: int) -> None:
    out = add_allow(text, host, port)
    assert out is not None, "every generated shape is supported"
    old = yaml.safe_load(text)
    with tempfile.TemporaryDirectory() as d:
        assert loads_and_allows(out, host, port, Path(d))
    if out is text:  # already allowed by an existing entry
        return
    new = yaml.safe_load(out)
    network = old.get("network") or {}
    assert new["network"]["allow"] == (network.get("allow") or []) + [{"host": host, "ports": [port]}]
    assert {k: v for k, v in new.items() if k != "network"} == {k: v for k, v in old.items() if k != "network"}
    assert {k: v for k, v in new["network"].items() if k != "allow"} == {
        k: v for k, v in network.items() if k != "allow"
    }
    # Nothing else touched: every comment survives in order, every old line is still there
    # (but the one rewritten flow list line), and at most the three new lines were added.
    old_lines, new_lines = text.splitlines(), out.splitlines()
    assert comments(out) == comments(text)
    assert len(new_lines) - len(old_lines) in (0, 1, 2, 3)
    kept = [line for line in old_lines if "allow: [" not in line]
    assert is_subsequence(kept, new_lines)
    assert allow_entry(host, port) in out
    assert ("\r\n" in text) == ("\r\n" in out)

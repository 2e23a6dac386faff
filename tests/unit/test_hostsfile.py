"""`hosts_file:` entries: the pure parse of a list of names, its rules, and the loader that reads it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from launcher.config import hostsfiles, parsecache
from launcher.config.errors import PolicyFileError
from launcher.config.load import build_policy, trust_chain
from netguard import hosts, rules
from netguard.hostsfile import MAX_NAMES, HostsList, parse_hosts_text
from netguard.policy import DEFAULT_ALLOW_PORTS, Rule, parse_network
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError

# ---- the pure parse ---------------------------------------------------------------------------


def test_names_wildcards_comments_and_blank_lines() -> None:
    text = "# a list\n\nPyPI.org.\n  *.Example.COM  # trailing comment\r\nb.test\npypi.org\n*.example.com\n"
    got = parse_hosts_text(text, "l.txt")
    assert got == HostsList("l.txt", (3, 4, 5), ("pypi.org", "example.com", "b.test"), (False, True, False))


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("alpha beta.test", "two words on one line"),
        ("0.0.0.0\tads.test", "two words on one line"),
        ("*", "'*' may only be the whole first label"),
        ("*.", "'*' may only be the whole first label"),
        ("a.*.test", "'*' may only be the whole first label"),
        ("a..b", "not a valid host name"),
        ("SECRET\x00x", "not a valid host name"),
        ("192.0.2.1", "an IP address"),
        ("[::1]", "an IP address"),
    ],
)
def test_a_bad_line_names_its_number_and_never_quotes_the_file(line: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_hosts_text(f"ok.test\n# c\n{line}\nlater.test\n", "l.txt")
    assert e.value.line == 3 and fragment in str(e.value)
    assert line.strip() not in str(e.value) or line.strip() in ("*", "*.")  # those are sandgate's own words


def test_the_name_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from netguard import hostsfile

    monkeypatch.setattr(hostsfile, "MAX_NAMES", 3)
    assert len(parse_hosts_text("a.t\nb.t\nc.t\na.t\n", "x").names) == 3  # a repeat is no new name
    with pytest.raises(PolicyError, match="more than 3 names") as e:
        parse_hosts_text("a.t\nb.t\nc.t\nd.t\n", "x")
    assert e.value.line == 4 and MAX_NAMES == 1_000_000


LABEL = st.text(alphabet="abnxyz019-_XN.*", min_size=1, max_size=12)  # "xn--", "0x1f", "A"


@settings(max_examples=400, deadline=None)
@given(st.lists(LABEL, min_size=1, max_size=6).map(".".join) | st.text(max_size=30))
@example("xn--nxasmq6b.test")
@example("a.xn--zz")
@example("a.0x1f")
@example("a.0b")
@example("a.123")
@example("_dmarc.example.org")
@example("-")
@example("a.b.")
@example("a" * 64 + ".test")
@example(("a" * 60 + ".") * 4 + "ab")
def test_the_canonical_shortcut_never_disagrees_with_the_full_parse(text: str) -> None:
    """hosts.normalise answers canonical names without the full parse: both must give the same."""
    try:
        full: object = (
            hosts._name_from_labels(parsed, text) if isinstance(parsed := hosts._split(text), list) else parsed
        )
    except (hosts.HostError, TypeError):
        full = "refused"
    try:
        quick: object = hosts.normalise(text)
    except hosts.HostError:
        quick = "refused"
    assert quick == full


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.from_regex(r"[a-z][a-z0-9-]{0,8}(\.[a-z][a-z0-9]{0,5}){1,3}", fullmatch=True)))
)
def test_every_listed_name_becomes_a_rule_at_its_line(entries: list[tuple[bool, str]]) -> None:
    text = "".join(f"{'*.' if w else ''}{n}\n# between\n" for w, n in entries)
    listed = parse_hosts_text(text, "f.txt")
    first: dict[tuple[bool, str], int] = {}
    for i, (w, n) in enumerate(entries):
        first.setdefault((w, n), 2 * i + 1)
    assert list(zip(listed.wildcard, listed.names, listed.lines, strict=True)) == [
        (w, n, ln) for (w, n), ln in first.items()
    ]
    pol = parse_network({"allow": [{"hosts_file": "f.txt", "ports": [443]}]}, "p.yaml", {"f.txt": listed})
    assert [r.origin for r in pol.allow] == [Origin("f.txt", ln) for ln in first.values()]
    assert pol.allow == tuple(
        Rule("wildcard" if w else "host", n, frozenset({443}), Origin("f.txt", ln)) for (w, n), ln in first.items()
    )


# ---- netguard.policy: the entry ---------------------------------------------------------------


def test_entry_ports_defaults_and_decisions() -> None:
    listed = {
        "a.txt": parse_hosts_text("x.test\n*.w.test\n", "a.txt"),
        "d.txt": parse_hosts_text("\nbad.w.test\n", "d.txt"),
    }
    section = {"allow": ["one.test", {"hosts_file": "a.txt"}], "deny": [{"hosts_file": "d.txt"}]}
    pol = parse_network(section, "p.yaml", listed)
    assert [r.ports for r in pol.allow] == [DEFAULT_ALLOW_PORTS] * 3 and pol.deny[0].ports is None
    rs = rules.compile_policy(pol)
    assert rules.decide(rs, "X.test", 443).rule == "a.txt:1"
    assert rules.decide(rs, "deep.w.test", 80).rule == "a.txt:2"
    assert rules.decide(rs, "bad.w.test", 443) == rules.Decision("deny", "d.txt:2", "denied by rule bad.w.test")
    assert rules.compile_policy(pol) is rs  # memoised on the policy object


@pytest.mark.parametrize(
    ("entry", "files", "fragment"),
    [
        ({"hosts_file": "a.txt", "dns": ["TXT"]}, {}, "'dns' does not go with 'hosts_file'"),
        ({"hosts_file": 5}, {}, "'hosts_file' must be a file path, not a number"),
        ({"hosts_file": "a.txt"}, None, "not read from an untrusted workspace policy"),
        ({"hosts_file": "a.txt", "ports": []}, {"a.txt": HostsList("a.txt", (), (), ())}, "'ports' is empty"),
    ],
)
def test_entry_mistakes(entry: dict[str, object], files: dict[str, HostsList] | None, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        parse_network({"allow": [entry]}, "p.yaml", files)


# ---- the loader: reading with the user's rights, bounded, at the right line ---------------------


def policy(tmp_path: Path, entry: str, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(f"version: 1\nnetwork:\n  allow:\n    - one.test\n    - hosts_file: {entry}\n      ports: [443]\n")
    return p


def test_relative_to_the_policy_and_recorded_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "corp.txt").write_text("# corp\na.test\n*.b.test\n")
    monkeypatch.chdir("/")
    got = build_policy([policy(tmp_path, "sub/corp.txt")], [], [])
    assert [str(r.origin) for r in got.network.allow] == [
        "%s:4" % (tmp_path / "policy.yaml"),
        f"{tmp_path}/sub/corp.txt:2",
        f"{tmp_path}/sub/corp.txt:3",
    ]
    assert tmp_path / "sub" / "corp.txt" in got.read  # kept read-only inside the sandbox like every policy file


def test_loader_errors_are_one_line_at_the_right_place(tmp_path: Path) -> None:
    p = policy(tmp_path, "nowhere.txt")
    with pytest.raises(PolicyFileError, match=rf"^{p}:5: hosts_file 'nowhere.txt' cannot be used: no such file"):
        build_policy([p], [], [])
    os.mkfifo(tmp_path / "fifo.txt")
    with pytest.raises(
        PolicyFileError, match=r":5: hosts_file 'fifo.txt' cannot be used: not a regular file \(a FIFO\)"
    ):
        build_policy([policy(tmp_path, "fifo.txt")], [], [])
    (tmp_path / "bad.txt").write_text("a.test\nb.test\nnot a name\n")
    with pytest.raises(PolicyFileError, match=rf"^{tmp_path}/bad.txt:3: two words on one line") as e:
        build_policy([policy(tmp_path, "bad.txt")], [], [])
    assert "not a name" not in str(e.value)
    (tmp_path / "latin.txt").write_bytes(b"a.test\n\xe9.test\n")
    with pytest.raises(PolicyFileError, match=rf"^{tmp_path}/latin.txt:2: not UTF-8 text"):
        build_policy([policy(tmp_path, "latin.txt")], [], [])


def test_size_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from netguard import hostsfile

    monkeypatch.setattr(hostsfile, "MAX_BYTES", 1 << 20)
    (tmp_path / "big.txt").write_text("a.test\n" * ((1 << 20) // 7 + 1))
    with pytest.raises(PolicyFileError, match="larger than 1 MiB, the most a hosts_file may hold"):
        build_policy([policy(tmp_path, "big.txt")], [], [])


def test_parse_cache_keeps_only_validated_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsecache, "CACHE_DIR", tmp_path / "cache")
    (tmp_path / "l.txt").write_text("a.test\n*.b.test\n")
    (tmp_path / "bad.txt").write_text("a.test\nSECRET LINE\n")
    first = build_policy([policy(tmp_path, "l.txt")], [], []).network
    assert len(list((tmp_path / "cache").glob(f"*{parsecache.HOSTS_SUFFIX}"))) == 1
    assert build_policy([policy(tmp_path, "l.txt")], [], []).network == first  # from the cache
    with pytest.raises(PolicyFileError):
        build_policy([policy(tmp_path, "bad.txt")], [], [])
    assert not any(b"SECRET" in f.read_bytes() for f in (tmp_path / "cache").iterdir())
    assert parsecache.get_hosts("a.test\n*.b.test\n", "elsewhere.txt") == parse_hosts_text(
        "a.test\n*.b.test\n", "elsewhere.txt"
    )


def test_trust_covers_the_hosts_file_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "l.txt").write_text("a.test\n")
    p = policy(tmp_path, "l.txt")
    assert (tmp_path / "l.txt", b"a.test\n") in trust_chain(p)  # `sandgate trust` records it
    seen: list[Path] = []
    with pytest.raises(PolicyFileError, match=rf"^{p}: hosts_file 'l.txt' changed since it was trusted$"):
        hostsfiles.read_all(
            {"allow": [{"hosts_file": "l.txt"}]}, p, str(p), lambda t, d: "changed since it was trusted", seen
        )
    assert seen == []


def test_a_cache_hit_is_not_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm run of a 10^5-entry policy must not re-encode and rewrite its parse (~0.5 s)."""
    monkeypatch.setattr(parsecache, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(parsecache, "_HITS", set())
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nnetwork:\n  allow: [a.test, {host: b.test, ports: [1]}]\n")
    first = build_policy([p], [], []).network
    (entry,) = (tmp_path / "cache").glob(f"*{parsecache.SUFFIX}")
    entry.write_bytes(entry.read_bytes() + b" ")  # still the same JSON: a rewrite would drop the blank
    assert build_policy([p], [], []).network == first
    assert entry.read_bytes().endswith(b" ")

"""netguard/credentials.py: brokered credentials as the policy names them, sentinels, and the leak check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netguard.credentials import (
    MIN_SECRET,
    VENDOR_PREFIXES,
    Credential,
    Secret,
    carried,
    leak_reason,
    parse_credentials,
    render,
    sentinel_for,
    too_short,
    vendor_prefix,
)
from netguard.policy import merge, parse_network
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError


def test_parse_defaults_and_forms() -> None:
    got = parse_credentials(
        [
            {"host": "API.OpenAI.com.", "value": "Bearer ${OPENAI_API_KEY}"},
            {"host": "npm.test", "header": "X-Token", "value": "${NPM_TOKEN}", "file": "~/.config/t"},
        ],
        "p.yaml",
        4,
    )
    assert got[0] == Credential(
        "api.openai.com", "Authorization", "Bearer ${OPENAI_API_KEY}", "OPENAI_API_KEY", None, Origin("p.yaml", 4)
    )
    assert got[1].header == "X-Token" and got[1].variable == "NPM_TOKEN" and got[1].file == "~/.config/t"


@pytest.mark.parametrize(
    ("item", "error"),
    [
        ("api.test", "a mapping"),
        ({"host": "api.test"}, "needs 'value'"),
        ({"value": "${K}"}, "needs 'host'"),
        ({"host": "*.api.test", "value": "${K}"}, "one host name"),
        ({"host": "198.18.0.1", "value": "${K}"}, "one host name"),
        ({"host": "a..test", "value": "${K}"}, "credential host"),
        ({"host": "api.test", "value": "Bearer KEY"}, "exactly one"),
        ({"host": "api.test", "value": "${A}${B}"}, "exactly one"),
        ({"host": "api.test", "value": "${K}\r\nX-Evil: 1"}, "exactly one"),
        ({"host": "api.test", "value": "${K}", "header": "Host"}, "not a header"),
        ({"host": "api.test", "value": "${K}", "header": "Content-Length"}, "not a header"),
        ({"host": "api.test", "value": "${K}", "header": "X Y"}, "not a header"),
        ({"host": "api.test", "value": "${K}", "file": ""}, "must be a path"),
        ({"host": "api.test", "value": "${K}", "token": "x"}, "unknown key 'token'"),
    ],
)
def test_parse_errors(item: object, error: str) -> None:
    with pytest.raises(PolicyError, match=error):
        parse_credentials([item], "p.yaml", 1)


def test_two_credentials_for_one_header_are_a_conflict_within_and_across_files() -> None:
    one = {"host": "api.test", "value": "${A}"}
    with pytest.raises(PolicyError, match=r"two credentials for header authorization on api\.test"):
        parse_credentials([one, {"host": "api.test", "header": "authorization", "value": "${B}"}], "p.yaml", 1)
    a = parse_network({"credentials": [one]}, "a.yaml")
    b = parse_network({"credentials": [{"host": "api.test", "value": "${B}"}]}, "b.yaml")
    assert merge([a, a]).credentials == a.credentials
    with pytest.raises(PolicyError, match=r"a\.yaml and b\.yaml"):
        merge([a, b])
    with pytest.raises(PolicyError, match="must be a list"):
        parse_network({"credentials": {"host": "api.test"}}, "p.yaml")


def test_render_puts_the_secret_in_place_of_the_variable_only() -> None:
    c = parse_credentials([{"host": "api.test", "value": "Bearer ${K} (${K2"}], "p", 1)[0]
    assert render(c, "s3cr3t$1\\g<0>") == "Bearer s3cr3t$1\\g<0> (${K2"


@pytest.mark.parametrize(
    ("secret", "prefix"),
    [
        ("sk-proj-abcdefghijklmnop", "sk-proj-"),
        ("sk-ant-api03-abcdefghijklmnop", "sk-ant-"),
        ("sk-abcdefghijklmnopqrst", "sk-"),
        ("ghp_XYZabcdefghijklmnop", "ghp_"),
        ("github_pat_11ABCDEFG0abcdefghij", "github_pat_"),
        ("npm_abcdefghijklmnopqrst", "npm_"),
        ("glpat-abcdefghijklmnopqrst", "glpat-"),
        ("xoxb-1234-5678-abcdefghij", "xoxb-"),
        ("pypi-AgEIcHlwaS5vcmcCJDAwMDA", "pypi-"),
        ("REALSECRET-0123456789abcdef", ""),  # issue 24: v2 kept "REALSECRET-"
        ("abcdefghij_0123456789", ""),
        ("AKIAIOSFODNN7EXAMPLE", ""),  # an AWS key id is no vendor prefix sandgate keeps
        ("SK-abcdefghijklmnopqrst", ""),  # prefixes are exact
        ("12-abcdefghijklmnopqr", ""),
    ],
)
def test_sentinels_keep_only_a_listed_vendor_prefix_and_never_the_secret(secret: str, prefix: str) -> None:
    s = sentinel_for(secret, "00ff")
    assert s == f"{prefix}sandgate-sentinel-00ff" and vendor_prefix(secret) == prefix
    assert secret not in s
    rest = secret[len(prefix) :]
    assert not s[len(prefix) :].startswith(rest[:1])  # not one character of the secret past its vendor prefix


@given(st.text(min_size=MIN_SECRET, max_size=64))
def test_a_sentinel_holds_nothing_of_the_secret_but_a_listed_prefix(secret: str) -> None:
    s = sentinel_for(secret, "00ff")
    kept = s[: s.index("sandgate-sentinel-")]
    assert kept in (*VENDOR_PREFIXES, "") and secret.startswith(kept)


def test_every_vendor_prefix_is_public_format_not_secret() -> None:
    """The list is short fixed text ending in a separator (or Google's fixed 'AIza'): nothing random."""
    for p in VENDOR_PREFIXES:
        assert len(p) <= 11 and (p[-1] in "-_" or p == "AIza"), p
    assert "AKIA" not in VENDOR_PREFIXES


@pytest.mark.parametrize(
    ("secret", "short"), [("x", True), ("a" * 15, True), ("a" * 16, False), ("sk-" + "a" * 13, False)]
)
def test_secrets_shorter_than_sixteen_characters_are_refused(secret: str, short: bool) -> None:
    why = too_short(secret)
    assert (why is not None) is short
    if why:
        assert f"is {len(secret)} character" in why and f"at least {MIN_SECRET} are needed" in why


def test_carried_finds_the_sentinel_or_the_real_value_and_the_reason_names_neither() -> None:
    s = Secret("api.test", "Authorization", "Bearer REAL", "REAL", "sk-sandgate-sentinel-1", "KEY", Origin("p", 1))
    assert carried("x-api-key: sk-sandgate-sentinel-1", (s,)) is s
    assert carried("/?q=REAL", (s,)) is s
    assert carried("nothing here", (s,)) is None
    why = leak_reason(s, "other.test", "header X-Api-Key")
    assert "$KEY" in why and "other.test" in why and "api.test" in why
    assert "REAL" not in why and s.sentinel not in why

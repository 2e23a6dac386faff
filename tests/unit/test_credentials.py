"""netguard/credentials.py: brokered credentials as the policy names them, sentinels, and the leak check."""

from __future__ import annotations

import pytest

from netguard.credentials import Credential, Secret, carried, leak_reason, parse_credentials, render, sentinel_for
from netguard.policy import merge, parse_network
from netguard.policyerror import PolicyError


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
        "api.openai.com", "Authorization", "Bearer ${OPENAI_API_KEY}", "OPENAI_API_KEY", None, "p.yaml:4"
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
    [("sk-proj-abc", "sk-"), ("ghp_XYZ", "ghp_"), ("npm_abc", "npm_"), ("abcdef", ""), ("12-ab", "")],
)
def test_sentinels_keep_a_vendor_prefix_and_never_the_secret(secret: str, prefix: str) -> None:
    s = sentinel_for(secret, "00ff")
    assert s == f"{prefix}sandgate-sentinel-00ff"
    assert secret not in s


def test_carried_finds_the_sentinel_or_the_real_value_and_the_reason_names_neither() -> None:
    s = Secret("api.test", "Authorization", "Bearer REAL", "REAL", "sk-sandgate-sentinel-1", "KEY", "p:1")
    assert carried("x-api-key: sk-sandgate-sentinel-1", (s,)) is s
    assert carried("/?q=REAL", (s,)) is s
    assert carried("nothing here", (s,)) is None
    why = leak_reason(s, "other.test", "header X-Api-Key")
    assert "$KEY" in why and "other.test" in why and "api.test" in why
    assert "REAL" not in why and s.sentinel not in why

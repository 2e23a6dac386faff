"""netguard/httprules.py: request rules of inspected hosts, parsed and matched (pure, hammered)."""

from __future__ import annotations

import itertools
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.config import bundled
from launcher.config.load import build_policy
from netguard import rules
from netguard.httprules import READ_ONLY, HttpRule, canonical_path, decide_request, parse_http, path_matches
from netguard.policy import parse_entry, parse_network
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError

from ..support.spellings import ISSUE_SPELLINGS

GIT = (
    HttpRule(READ_ONLY, None, Origin("p", 1)),
    HttpRule(frozenset({"POST"}), ("/*/*/git-upload-pack",), Origin("p", 2)),
)


# ---- canonical paths (netguard/canonpath.py; exhaustive and property tests in test_canonpath.py) ----


@pytest.mark.parametrize(
    ("target", "canonical"),
    [
        ("/", "/"),
        ("/o/r/info/refs?service=git-upload-pack", "/o/r/info/refs"),
        ("/%41%62c", "/Abc"),
        ("/@types%2fnode", "/@types%2Fnode"),  # npm scoped names keep their encoded slash
        ("/a%3fb%23c", "/a%3Fb%23c"),  # an escaped '?' or '#' is part of the path, not its end
        ("/a%20b", "/a%20b"),
        ("//x", "//x"),
    ],
)
def test_canonical_path(target: str, canonical: str) -> None:
    assert canonical_path(target) == canonical


@pytest.mark.parametrize(
    "target",
    [
        "/o/r/git-upload-pack/../../x/y/git-receive-pack",
        "/o/r/%2e%2e/x",
        "/o/r/%2E%2e/x",
        "/o/./r",
        "/o/r/..",
        "/o\\r",
        "/o/%zz",
        "/o/%4",
        "/o/r#frag",
        "/a%5Cb",
        "/a%2525",
        "*",
        "o/r",
        "http://evil.test/o/r",
        "",
    ],
)
def test_ambiguous_paths_are_refused_whatever_the_rules(target: str) -> None:
    """The threat: our glob reads one path while the upstream reads another (dot segments, escapes, '\\')."""
    assert canonical_path(target) is None
    d = decide_request(None, "git.test", "GET", target)
    assert not d.allowed and "not canonical" in d.reason


@given(st.text(alphabet="/ab.%2eEfF5cC\\?#;", max_size=24))
def test_canonical_is_idempotent_and_never_holds_a_dot_segment(target: str) -> None:
    c = canonical_path(target)
    if c is None:
        return
    assert canonical_path(c) == c
    assert "." not in c.split("/") and ".." not in c.split("/") and "\\" not in c and "?" not in c and ";" not in c


V1 = (HttpRule(frozenset({"GET"}), ("/v1/**",), Origin("p", 1)),)


@pytest.mark.parametrize("target", ISSUE_SPELLINGS)
def test_the_issues_spellings_are_refused_before_any_rule_matches(target: str) -> None:
    """Issue 24: each reached the upstream under `GET /v1/**`, with the brokered credential."""
    for given_rules in (V1, None, (HttpRule(None, None, Origin("p", 1)),)):
        d = decide_request(given_rules, "api.test", "GET", target)
        assert not d.allowed and d.rule is None and "path is not canonical: " in d.reason, (given_rules, d)
        assert d.reason.startswith(f"GET {target}: ")
    assert decide_request(V1, "api.test", "GET", "/v1/ok").allowed  # the control


# ---- an escaped '/', '?', '#' or '//': every reading must be allowed ------------------------------


@pytest.mark.parametrize(
    ("rules", "method", "target", "allowed"),
    [
        # read-only covers every path: npm's scoped metadata passes, however a server reads the %2F
        ((HttpRule(READ_ONLY, None, Origin("p", 1)),), "GET", "/@types%2fnode", True),
        ((HttpRule(READ_ONLY, None, Origin("p", 1)),), "GET", "//x", True),
        # '**' after a literal prefix: both readings stay under it
        (
            (HttpRule(frozenset({"POST"}), ("/-/npm/v1/security/**",), Origin("p", 1)),),
            "POST",
            "/-/npm/v1/security/a%2Fb",
            True,
        ),
        # '*' is one segment: a server decoding %2F sees two, so the rule does not cover it
        (GIT, "POST", "/o%2Fx/r/git-upload-pack", False),
        (GIT, "POST", "/o/r%2Fgit-upload-pack/x/git-upload-pack", False),
        ((HttpRule(frozenset({"GET"}), ("/v1/*",), Origin("p", 1)),), "GET", "/v1/a%2Fb", False),
        # merged slashes shift what '*' takes
        (GIT, "POST", "//r/git-upload-pack", False),
        # a server cutting at a decoded '?' sees a shorter path the rule does not cover
        ((HttpRule(frozenset({"POST"}), ("/files/*.txt",), Origin("p", 1)),), "POST", "/files/a%3F.txt", False),
        ((HttpRule(frozenset({"POST"}), ("/files/*.txt",), Origin("p", 1)),), "POST", "/files/a%23.txt", False),
        # a rule that says a segment may hold an escaped slash: both readings covered
        ((HttpRule(frozenset({"GET"}), ("/@*%2F*",), Origin("p", 1)),), "GET", "/@scope%2fname", True),
        ((HttpRule(frozenset({"GET"}), ("/@*%2F*",), Origin("p", 1)),), "GET", "/@scope/name", False),
        ((HttpRule(frozenset({"GET"}), ("/@*%2F*",), Origin("p", 1)),), "GET", "/@scope%2fname%2fx", False),
    ],
)
def test_an_ambiguous_separator_passes_only_where_every_reading_is_allowed(
    rules: tuple[HttpRule, ...], method: str, target: str, allowed: bool
) -> None:
    d = decide_request(rules, "h.test", method, target)
    assert d.allowed is allowed, d
    if not allowed:
        assert "not allowed on h.test" in d.reason


# ---- method overrides and upgrades ----------------------------------------------------------------

POST_V1 = (HttpRule(frozenset({"GET", "POST"}), ("/v1/**",), Origin("p", 1)),)


#: Override headers frameworks read (Rails, Symfony, ASP.NET, OData, Google; auth subrequests read
#: X-Original-Method, forward-auth X-Forwarded-Method), written out here, not read from the product.
OVERRIDE_NAMES = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "X-Original-Method",
                  "X-Forwarded-Method")  # fmt: skip


def header_spellings(name: str) -> list[str]:
    """Every case and '-'/'_' spelling a server reads as `name` (CGI, PHP, WSGI: HTTP_X_HTTP_METHOD_OVERRIDE)."""
    parts = name.split("-")
    out: list[str] = []
    for seps in itertools.product("-_", repeat=len(parts) - 1):
        joined = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=True))
        out += [joined, joined.lower(), joined.upper()]
    return out


@pytest.mark.parametrize("header", [h for name in OVERRIDE_NAMES for h in header_spellings(name)])
def test_method_override_headers_are_refused_on_hosts_with_rules(header: str) -> None:
    d = decide_request(POST_V1, "api.test", "POST", "/v1/ok", [("Content-Type", "x"), (header, "DELETE")])
    assert not d.allowed and f"method-override header ({header})" in d.reason
    assert decide_request(POST_V1, "api.test", "POST", "/v1/ok", [("Content-Type", "x")]).allowed  # the control


@pytest.mark.parametrize("header", ["X-Method", "Method", "X-HTTP-Method-Overrides", "X-Original-URL", "X-HTTP"])
def test_other_headers_are_not_overrides(header: str) -> None:
    assert decide_request(POST_V1, "api.test", "POST", "/v1/ok", [(header, "DELETE")]).allowed


@pytest.mark.parametrize(
    "query",
    ["_method=DELETE", "a=1&_method=PUT", "%5Fmethod=DELETE", "_METHOD=x", "a=1;_method",
     # PHP's spellings of `_method`: leading spaces dropped, ' ' '.' and an unclosed '[' read as '_',
     # `name[]` an array of `name`; decoded first ('+' is a space)
     ".method=DELETE", "+method=DELETE", "%20method=DELETE", "_method[]=DELETE", "_method[x]=DELETE",
     "%2Emethod=x", "%2emethod=x", "[method=x", "%5Bmethod=x", "_method%5B%5D=x", "+_method=x", "%20%20_method=x",
     "++.method=x", " .method=x", "a=1&.method=PUT", "_method[=x"],
)  # fmt: skip
def test_a_method_override_query_parameter_is_refused(query: str) -> None:
    d = decide_request(POST_V1, "api.test", "POST", f"/v1/ok?{query}")
    assert not d.allowed and "'_method' query parameter" in d.reason
    assert decide_request(POST_V1, "api.test", "POST", "/v1/ok?method=x&a_method=y").allowed


def php_name(raw: str) -> str:
    """PHP's name for a query parameter (main/php_variables.c), written out: decoded, leading spaces
    dropped, ' ' and '.' to '_' up to the first '['; `a[...]` is the array `a`, an unclosed '[' is '_'."""
    name = unquote_plus(raw).lstrip(" ")
    out: list[str] = []
    for i, ch in enumerate(name):
        if ch == "[":
            if "]" in name[i:]:
                break
            return "".join(out) + "_" + name[i + 1 :]
        out.append("_" if ch in " ." else ch)
    return "".join(out)


NAME_PARTS = ("", " ", "+", "%20", ".", "%2E", "_", "%5F", "[", "]", "[]", "%5B", "a", "method", "METHOD")


def test_every_short_parameter_name_php_reads_as_method_is_refused() -> None:
    """Exhaustive over names of up to four parts: PHP's `_method` is refused; the controls pass."""
    refused = passed = 0
    for k in range(1, 5):
        for parts in itertools.product(NAME_PARTS, repeat=k):
            raw = "".join(parts)
            d = decide_request(POST_V1, "api.test", "POST", f"/v1/ok?x=1&{raw}=DELETE")
            if php_name(raw).lower() == "_method":
                assert not d.allowed and "'_method' query parameter" in d.reason, raw
                refused += 1
            elif "method" not in raw.lower():
                assert d.allowed, (raw, d)
                passed += 1
    assert refused > 100 and passed > 1000, (refused, passed)


def test_an_override_is_refused_even_where_every_method_is_allowed() -> None:
    """inspect without http: the host may carry a brokered credential; the header never goes upstream."""
    d = decide_request(None, "api.test", "POST", "/v1/ok", [("X-HTTP-Method-Override", "GET")])
    assert not d.allowed and "method-override header" in d.reason
    assert decide_request(None, "api.test", "POST", "/v1/ok", [("X-Other", "GET")]).allowed  # the control


WS = (
    HttpRule(READ_ONLY, None, Origin("p", 1)),
    HttpRule(frozenset({"GET"}), ("/v1/realtime",), Origin("p", 2), websocket=True),
)
UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]


def test_a_websocket_upgrade_needs_a_rule_that_says_so() -> None:
    ok = decide_request(WS, "api.test", "GET", "/v1/realtime", UPGRADE)
    assert ok.allowed and ok.rule == "p:2" and "websocket" in ok.reason
    other = decide_request(WS, "api.test", "GET", "/v1/other", UPGRADE)  # read-only covers the GET, not the upgrade
    assert not other.allowed and "a WebSocket upgrade of GET /v1/other not allowed" in other.reason
    assert decide_request(WS, "api.test", "GET", "/v1/other").allowed  # the same GET without the upgrade
    bare = decide_request(None, "api.test", "GET", "/v1/realtime", [("upgrade", "WebSocket")])
    assert not bare.allowed and "needs an http rule with websocket: true" in bare.reason
    for proto in ("h2c", "websocket, h2c", "TLS/1.2"):
        d = decide_request(WS, "api.test", "GET", "/v1/realtime", [("Upgrade", proto)])
        assert not d.allowed and "no rule reads that protocol" in d.reason, proto


@pytest.mark.parametrize(
    "upgrades",
    [["websocket", "h2c"], ["h2c", "websocket"], ["websocket", "websocket"], ["", "h2c"], ["websocket", ""],
     ["", ""], ["websocket, h2c"], ["h2c, websocket"], ["websocket,"], ["websocket, websocket"], ["websocket/13, h2c"]],
)  # fmt: skip
def test_more_than_one_upgrade_header_or_protocol_is_refused(upgrades: list[str]) -> None:
    """Issue 24's review: with `Upgrade: websocket` and `Upgrade: h2c` only the first was read, both went on."""
    headers = [("Connection", "Upgrade"), *(("Upgrade" if i % 2 else "upgrade", v) for i, v in enumerate(upgrades))]
    d = decide_request(WS, "api.test", "GET", "/v1/realtime", headers)
    assert not d.allowed and "no rule reads that protocol" in d.reason and "one Upgrade header" in d.reason, d
    for one in ("websocket", " WebSocket ", "WEBSOCKET"):  # the control: one header, exactly websocket
        assert decide_request(
            WS, "api.test", "GET", "/v1/realtime", [("Connection", "Upgrade"), ("Upgrade", one)]
        ).allowed


def test_websocket_rules_parse_and_describe() -> None:
    (r,) = parse_http([{"methods": ["GET"], "paths": ["/ws"], "websocket": True}], "f.yaml", 2)
    assert r.websocket and r.describe() == "GET /ws websocket"
    (any_method,) = parse_http([{"paths": ["/ws"], "websocket": True}], "f.yaml", 2)
    assert any_method.websocket and any_method.methods is None
    for bad, error in [
        ({"methods": ["POST"], "paths": ["/ws"], "websocket": True}, "needs GET"),
        ({"paths": ["/ws"], "websocket": "yes"}, "true or false"),
        ({"websocket": True}, "needs methods, paths or both"),
    ]:
        with pytest.raises(PolicyError, match=error):
            parse_http([bad], "f.yaml", 2)


def test_websocket_survives_the_spec_to_the_daemon() -> None:
    from netguard import spec

    rule = parse_entry({"host": "api.test", "http": [{"paths": ["/ws"], "websocket": True}, "read-only"]}, "p", 1, None)
    back = spec._decode_http([spec._encode_http(h) for h in rule.http or ()], "w")
    assert back == rule.http and back is not None and back[0].websocket and not back[1].websocket


# ---- globs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("/*/*/git-upload-pack", "/o/r/git-upload-pack", True),
        ("/*/*/git-upload-pack", "/o/r.git/git-upload-pack", True),
        ("/*/*/git-upload-pack", "/o/r/git-receive-pack", False),
        ("/*/*/git-upload-pack", "/o/x/r/git-upload-pack", False),  # '*' stays within a segment
        ("/*/*/git-upload-pack", "/o/r/git-upload-pack/x", False),
        ("/*/*/git-upload-pack", "/o/r/git-upload-packx", False),
        ("/**/git-upload-pack", "/a/b/c/git-upload-pack", True),
        ("/-/npm/v1/security/**", "/-/npm/v1/security/advisories/bulk", True),
        ("/-/npm/v1/security/**", "/-/npm/v1/securityx", False),
        ("/a.b", "/aXb", False),  # '.' is literal, not a regex
        ("/a+", "/aa", False),
        ("/x", "/X", False),
    ],
)
def test_path_matches(pattern: str, path: str, hit: bool) -> None:
    assert path_matches(pattern, path) is hit


@given(st.text(alphabet="ab/-", max_size=12))
def test_a_single_star_never_crosses_a_slash(seg: str) -> None:
    assert path_matches("/*", "/" + seg) is ("/" not in seg)


# ---- decisions ------------------------------------------------------------------------------


def test_git_read_only_allows_fetch_and_refuses_push() -> None:
    assert decide_request(GIT, "git.test", "GET", "/o/r/info/refs?service=git-upload-pack").allowed
    up = decide_request(GIT, "git.test", "POST", "/o/r.git/git-upload-pack")
    assert up.allowed and up.rule == "p:2"
    push = decide_request(GIT, "git.test", "POST", "/o/r.git/git-receive-pack")
    assert not push.allowed and push.rule is None
    assert "POST /o/r.git/git-receive-pack not allowed on git.test" in push.reason
    assert "read-only" in push.reason and "POST /*/*/git-upload-pack" in push.reason


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "CONNECT", "TRACE", "get", "Get", "PROPFIND"])
def test_read_only_refuses_every_other_method_and_other_spellings(method: str) -> None:
    """Methods are case-sensitive in HTTP: a server that folds `get` into GET must not get a write through."""
    ro = (HttpRule(READ_ONLY, None, Origin("p", 1)),)
    assert not decide_request(ro, "h.test", method, "/x").allowed


@pytest.mark.parametrize(
    "headers, allowed",
    [
        ((), True),
        ((("Content-Length", "0"),), True),
        ((("Content-Length", "48"),), False),
        ((("content-length", " 7 "),), False),
        ((("Transfer-Encoding", "chunked"),), False),
        ((("transfer-encoding", "identity"),), False),
    ],
)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_get_or_head_with_a_body_is_refused_where_rules_judge(
    method: str, headers: tuple[tuple[str, str], ...], allowed: bool
) -> None:
    """CL.0 smuggling: an endpoint that ignores a GET's length reads its body (`DELETE /x HTTP/1.1...`) as the
    next request, which no rule judged. Where every request is allowed anyway (no rules), nothing is gained."""
    ro = (HttpRule(READ_ONLY, None, Origin("p", 1)),)
    d = decide_request(ro, "h.test", method, "/x", headers)
    assert d.allowed == allowed and (allowed or "CL.0 request smuggling" in d.reason)
    assert decide_request(None, "h.test", method, "/x", headers).allowed


def test_the_query_string_never_widens_a_path_rule() -> None:
    only = (HttpRule(frozenset({"POST"}), ("/ok",), Origin("p", 1)),)
    assert decide_request(only, "h.test", "POST", "/ok?x=/../evil").allowed
    assert not decide_request(only, "h.test", "POST", "/evil?/ok").allowed


def test_inspect_without_rules_allows_every_canonical_request() -> None:
    d = decide_request(None, "h.test", "DELETE", "/anything")
    assert d.allowed and d.rule is None


# ---- parsing --------------------------------------------------------------------------------


def test_parse_http_forms_and_origins() -> None:
    got = parse_http(["read-only", {"methods": ["post", "PUT"], "paths": ["/a/*"]}, {"paths": "/b"}], "f.yaml", 7)
    assert got[0] == HttpRule(READ_ONLY, None, Origin("f.yaml", 7))
    assert got[1].methods == frozenset({"POST", "PUT"}) and got[1].paths == ("/a/*",)
    assert got[2].methods is None and got[2].paths == ("/b",)
    assert parse_http("read-only", "f.yaml", None) == (HttpRule(READ_ONLY, None, Origin("f.yaml")),)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], "'http' is empty"),
        ("readonly", "read-only or a mapping"),
        ({"method": ["GET"]}, "unknown key 'method'"),
        ({"paths": ["/a;b"]}, "not canonical"),
        ({"paths": ["/a/%2e%2e/b"]}, "not canonical"),
        ({"paths": ["/caf\u00e9"]}, "not canonical"),
        ({}, "needs methods, paths or both"),
        ({"methods": []}, "'methods' is empty"),
        ({"methods": ["GE T"]}, "invalid method"),
        ({"methods": [1]}, "invalid method"),
        ({"paths": ["a/b"]}, "starts with '/'"),
        ({"paths": ["/a?x=1"]}, "without a query"),
        ({"paths": ["/a/../b"]}, "not canonical"),
        ({"paths": ["/a%2fb"]}, "not canonical"),
        ({"paths": []}, "'paths' is empty"),
    ],
)
def test_parse_http_errors(value: object, error: str) -> None:
    with pytest.raises(PolicyError, match=error):
        parse_http(value, "f.yaml", 3)


def test_policy_entries_opt_in_and_errors() -> None:
    pol = parse_network(
        {
            "allow": [
                {"host": "git.test", "http": "read-only"},
                {"host": "api.test", "inspect": True},
                {"host": "q.test", "log_query": True},
                {"host": "plain.test", "inspect": False},
                "other.test",
            ]
        },
        "p.yaml",
    )
    flags = [(r.inspect, r.http is not None, r.log_query) for r in pol.allow]
    off = (False, False, False)
    assert flags == [(True, True, False), (True, False, False), (True, False, True), off, off]
    for entry, error in [
        ({"cidr": "198.18.0.0/15", "inspect": True}, "needs a host name"),
        ({"host": "x.test", "inspect": "yes"}, "true or false"),
        ({"host": "x.test", "inspect": False, "http": "read-only"}, "rules need inspection"),
    ]:
        with pytest.raises(PolicyError, match=error):
            parse_network({"allow": [entry]}, "p.yaml")
    with pytest.raises(PolicyError, match="belongs on allow entries"):
        parse_network({"deny": [{"host": "x.test", "http": "read-only"}]}, "p.yaml")


# ---- which destinations are inspected ----------------------------------------------------------


def test_inspection_only_counts_inspecting_entries() -> None:
    """A plain allow for the same host (a bundled list, --allow) never widens an inspected host."""
    rs = rules.compile_policy(
        parse_network(
            {
                "allow": [
                    "github.com",
                    {"host": "github.com", "http": "read-only"},
                    {"host": "*.example.test", "http": [{"methods": ["POST"], "paths": ["/p"]}], "ports": [8443]},
                    "plain.test",
                ]
            },
            "p.yaml",
        )
    )
    insp = rules.inspection(rs, "GitHub.com.", 443)
    assert insp is not None and insp.http is not None and len(insp.http) == 1
    assert rules.inspection(rs, "plain.test", 443) is None
    assert rules.inspection(rs, "a.example.test", 443) is None  # that entry covers 8443 only
    wild = rules.inspection(rs, "a.example.test", 8443)
    assert wild is not None and wild.http is not None and wild.http[0].paths == ("/p",)
    assert rules.inspection(rs, "198.18.0.1", 443) is None


def test_inspect_true_anywhere_means_every_request_on_that_host() -> None:
    rs = rules.compile_policy(
        parse_network({"allow": [{"host": "h.test", "http": "read-only"}, {"host": "h.test", "inspect": True}]}, "p")
    )
    insp = rules.inspection(rs, "h.test", 443)
    assert insp is not None and insp.http is None


# ---- the bundled presets ------------------------------------------------------------------------


def _preset(name: str) -> rules.Ruleset:
    path = bundled.bundled_path(name)
    assert path is not None
    return rules.compile_policy(build_policy([Path(path)], [], []).network)


def _req(rs: rules.Ruleset, host: str, method: str, path: str) -> bool:
    insp = rules.inspection(rs, host, 443)
    assert insp is not None, f"{host} is not inspected"
    return decide_request(insp.http, host, method, path).allowed


def test_github_readonly_clones_and_fetches_but_never_pushes() -> None:
    rs = _preset("github-readonly")
    assert rules.decide(rs, "github.com", 443).allowed
    assert _req(rs, "github.com", "GET", "/o/r.git/info/refs?service=git-upload-pack")
    assert _req(rs, "github.com", "POST", "/o/r.git/git-upload-pack")
    assert _req(rs, "github.com", "POST", "/o/r/git-upload-pack")
    assert not _req(rs, "github.com", "POST", "/o/r.git/git-receive-pack")
    assert not _req(rs, "github.com", "POST", "/o/r/git-receive-pack")
    assert not _req(rs, "api.github.com", "POST", "/graphql")
    assert not _req(rs, "api.github.com", "DELETE", "/repos/o/r")
    assert _req(rs, "api.github.com", "GET", "/repos/o/r/releases/latest")
    for host in ("codeload.github.com", "raw.githubusercontent.com", "objects.githubusercontent.com"):
        assert _req(rs, host, "GET", "/o/r/x") and not _req(rs, host, "PUT", "/o/r/x")


def test_npm_readonly_installs_and_audits_but_never_publishes() -> None:
    rs = _preset("npm-readonly")
    assert _req(rs, "registry.npmjs.org", "GET", "/@types%2fnode")
    assert _req(rs, "registry.npmjs.org", "POST", "/-/npm/v1/security/advisories/bulk")
    assert not _req(rs, "registry.npmjs.org", "PUT", "/my-package")  # npm publish
    assert not _req(rs, "registry.npmjs.org", "DELETE", "/my-package/-rev/1-abc")  # npm unpublish
    assert not _req(rs, "registry.npmjs.org", "PUT", "/-/package/my-package/dist-tags/latest")
    assert not _req(rs, "registry.npmjs.org", "PUT", "/-/user/org.couchdb.user:me")  # npm login
    assert not _req(rs, "registry.yarnpkg.com", "PUT", "/my-package")


def test_pypi_readonly_denies_the_upload_host_whatever_else_allows_it() -> None:
    rs = _preset("pypi-readonly")
    assert _req(rs, "pypi.org", "GET", "/simple/requests/")
    assert not _req(rs, "pypi.org", "POST", "/legacy/")
    assert not rules.decide(rs, "upload.pypi.org", 443).allowed
    plain = _preset("pypi")
    assert not rules.decide(plain, "upload.pypi.org", 443).allowed  # not listed in the default list either
    assert rules.inspection(plain, "pypi.org", 443) is None  # and the default list stays passthrough


@pytest.mark.parametrize(
    "target",
    [
        "/@types%2fnode",  # npm (npm-package-arg's escapedName), yarn 1
        "/@types%2Fnode",  # pnpm, yarn berry (encodeURIComponent)
        "/%40types%2fnode",  # clients that escape the '@' as well
        "/@types/node/-/node-20.1.0.tgz",  # tarballs: the metadata's URL, unescaped
        "/@types%2fnode/latest",
    ],
)
def test_real_registry_clients_spellings_pass_the_bundled_readonly_lists(target: str) -> None:
    """Issue 24: refusing ambiguous paths must not break what npm, pnpm and yarn send."""
    rs = _preset("npm-readonly")
    for host in ("registry.npmjs.org", "registry.yarnpkg.com"):
        assert _req(rs, host, "GET", target), (host, target)


def test_the_bundled_lists_refuse_the_issues_spellings_on_their_write_rules() -> None:
    npm = _preset("npm-readonly")
    assert _req(npm, "registry.npmjs.org", "POST", "/-/npm/v1/security/advisories/bulk")  # the control
    for t in ("/-/npm/v1/security/..%2f..%2f..%2fpkg", "/-/npm/v1/security/..;/x", "/-/npm/v1/security/%2e%2e/x"):
        assert not _req(npm, "registry.npmjs.org", "POST", t), t
    gh = _preset("github-readonly")
    assert _req(gh, "github.com", "POST", "/o/r.git/git-upload-pack")
    assert not _req(gh, "github.com", "POST", "/o%2Fr/x/git-upload-pack")  # '*' is one segment, read either way
    assert not _req(gh, "github.com", "POST", "/o/r.git/git-upload-pack/..%2fgit-receive-pack")

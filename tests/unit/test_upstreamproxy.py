"""netguard.upstreamproxy: the corporate proxy's settings from the environment and --upstream-proxy, NO_PROXY
with curl's matching, the CONNECT sent and the answer read; and the spec that carries them to the daemon."""

from __future__ import annotations

import base64

import pytest

from netguard import spec
from netguard import upstreamproxy as up
from netguard.policy import NetworkPolicy
from netguard.upstreamproxy import Proxy, Upstream, UpstreamError

P = Proxy("proxy.corp", 3128)

# ---- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("http://proxy.corp:3128", Proxy("proxy.corp", 3128)),
        ("http://proxy.corp:3128/", Proxy("proxy.corp", 3128)),
        ("HTTP://Proxy.Corp:8080", Proxy("proxy.corp", 8080)),
        ("proxy.corp:3128", Proxy("proxy.corp", 3128)),  # no scheme: http, as curl and requests read it
        ("  http://10.0.0.1:3128  ", Proxy("10.0.0.1", 3128)),
        ("http://[fd00::1]:3128", Proxy("fd00::1", 3128)),
        ("http://user:pa%3Ass%40w@proxy.corp:3128", Proxy("proxy.corp", 3128, "user:pa:ss@w")),
        ("http://user@proxy.corp:3128", Proxy("proxy.corp", 3128, "user:")),
        ("http://dom%5Cuser:pw@proxy.corp:3128", Proxy("proxy.corp", 3128, "dom\\user:pw")),
    ],
)
def test_proxy_urls(text: str, want: Proxy) -> None:
    assert up.parse_url(text, "HTTPS_PROXY") == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("https://proxy.corp:3128", "only http:// proxies are supported, not https://"),
        ("socks5://proxy.corp:1080", "only http:// proxies are supported, not socks5://"),
        ("http://proxy.corp", "give the proxy's port"),
        ("http://proxy.corp:0", "give the proxy's port"),
        ("http://proxy.corp:99999", "not a proxy URL"),
        ("http://proxy.corp:port", "not a proxy URL"),
        ("http://:3128", "names no host"),
        ("http://proxy.corp:3128/path", "no path, query or fragment"),
        ("http://proxy.corp:3128/?q=1", "no path, query or fragment"),
        ("http://u:p%0d%0aX-Evil:%201@proxy.corp:3128", "line break"),  # header injection into the CONNECT
    ],
)
def test_bad_proxy_urls_say_where_and_why(text: str, says: str) -> None:
    with pytest.raises(UpstreamError) as e:
        up.parse_url(text, "HTTPS_PROXY")
    assert str(e.value).startswith("HTTPS_PROXY: ") and says in str(e.value)


def test_shown_never_carries_the_credentials() -> None:
    p = up.parse_url("http://user:hunter2@proxy.corp:3128", "x")
    assert p.shown == "http://proxy.corp:3128" and "hunter2" not in repr(up.refusal(p, "1.2.3.4:443", "407"))
    assert Proxy("fd00::1", 3128).shown == "http://[fd00::1]:3128"


# ---- the environment and the option -------------------------------------------------------------


def test_lower_case_wins_and_empty_is_unset() -> None:
    env = {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:1", "HTTP_PROXY": "http://plain:2"}
    assert up.choose(None, env) == Upstream(Proxy("low", 1), Proxy("plain", 2), "")
    env = {"https_proxy": "", "HTTPS_PROXY": "http://up:1", "no_proxy": " ", "NO_PROXY": "a.test"}
    assert up.choose(None, env) == Upstream(Proxy("up", 1), None, "a.test")
    assert up.choose(None, {"no_proxy": "x", "NO_PROXY": "y", "http_proxy": "h:1"}) == Upstream(
        None, Proxy("h", 1), "x"
    )


def test_nothing_set_is_no_proxy_and_all_proxy_is_not_read() -> None:
    assert up.choose(None, {}) is None
    assert up.choose(None, {"ALL_PROXY": "socks5://x:1080", "all_proxy": "http://x:1", "NO_PROXY": "*"}) is None


def test_the_option_wins_and_keeps_no_proxy() -> None:
    env = {"HTTPS_PROXY": "http://env:1", "HTTP_PROXY": "http://env:2", "NO_PROXY": "in.test"}
    assert up.choose("http://opt:3", env) == Upstream(Proxy("opt", 3), Proxy("opt", 3), "in.test")
    assert up.choose("none", env) is None and up.choose("NONE", env) is None
    assert up.choose("none", {"HTTPS_PROXY": "socks5://bad:1"}) is None  # a bad variable is never read
    with pytest.raises(UpstreamError, match=r"^--upstream-proxy: "):
        up.choose("ftp://opt:3", env)
    with pytest.raises(UpstreamError, match=r"^https_proxy: "):
        up.choose(None, {"https_proxy": "https://p:1"})


def test_routes_by_kind_and_no_proxy() -> None:
    u = Upstream(Proxy("tls", 1), Proxy("plain", 2), "skip.test")
    assert u.route("a.test", plain_http=False) == Proxy("tls", 1)
    assert u.route("a.test", plain_http=True) == Proxy("plain", 2)
    assert u.route("x.skip.test", plain_http=False) is None
    assert Upstream(Proxy("tls", 1)).route("a.test", plain_http=True) is None  # no http_proxy: plain HTTP direct


# ---- NO_PROXY, as curl matches it ----------------------------------------------------------------

NAMES = [
    # (NO_PROXY, host, bypassed)
    ("*", "anything.test", True),
    ("*", "10.1.2.3", True),
    (" * ", "x.test", True),
    ("*,a.test", "x.test", False),  # `*` only as the whole list
    ("*.example.com", "a.example.com", False),  # no wildcard syntax
    ("example.com", "example.com", True),
    ("example.com", "www.example.com", True),
    ("example.com", "a.b.example.com", True),
    ("example.com", "badexample.com", False),
    ("example.com", "example.com.evil.test", False),
    ("example.com", "xample.com", False),
    (".example.com", "example.com", True),
    (".example.com", "www.example.com", True),
    (".example.com", "badexample.com", False),
    ("example.com.", "www.example.com", True),
    ("example.com", "www.example.com.", True),
    ("EXAMPLE.com", "Www.Example.COM", True),
    ("a.test,example.com", "example.com", True),
    ("a.test , example.com", "example.com", True),
    ("a.test,,,example.com", "example.com", True),
    (",example.com,", "example.com", True),
    ("a.test example.com", "example.com", False),  # a blank not followed by a comma ends the list
    ("a.test\texample.com", "example.com", False),
    ("example.com:443", "example.com", False),  # no ports
    ("", "example.com", False),
    (".", "example.com", False),
    ("localhost", "localhost", True),
    ("localhost", "127.0.0.1", False),  # names and addresses never match each other
    ("127.0.0.1", "localhost", False),
    ("10.1.2.3", "10.1.2.3", True),
    ("10.1.2.3", "10.1.2.4", False),
    ("10.0.0.0/8", "10.200.1.1", True),
    ("10.0.0.0/8", "11.0.0.1", False),
    ("10.1.2.3/8", "10.9.9.9", True),  # host bits ignored, as curl masks
    ("198.51.100.0/24", "198.51.100.255", True),
    ("0.0.0.0/0", "203.0.113.9", False),  # curl: /0 compares the address itself
    ("0.0.0.0/0", "0.0.0.0", True),
    ("10.1.2.3/", "10.1.2.3", True),  # no digits after the slash: atoi's 0, the address itself
    ("10.0.0.0/33", "10.0.0.1", False),
    ("10.0.0.0/x", "10.0.0.0", True),
    ("fd00::/129", "fd00::1", False),
    ("fd00::1/128", "fd00::1", True),
    ("nonsense/8", "10.0.0.1", False),
    ("10.0.0.0/8", "example.com", False),
    ("::1", "::1", True),
    ("::1", "[::1]", True),  # a bracketed host literal
    ("fd00::/8", "fd12::5", True),
    ("fd00::/8", "fe80::1", False),
    ("fd00::/8", "10.0.0.1", False),
    ("10.0.0.0/8", "fd00::1", False),
    ("[::1]", "::1", False),  # curl compares the entry as written: no brackets in NO_PROXY
    ("2001:db8::1", "2001:DB8::1", True),  # compared as addresses
]


@pytest.mark.parametrize(("no_proxy", "host", "bypassed"), NAMES)
def test_no_proxy_matches_like_curl(no_proxy: str, host: str, bypassed: bool) -> None:
    assert up.bypass(no_proxy, host) is bypassed


def test_an_empty_host_is_never_bypassed() -> None:
    assert up.bypass("*", "") is False


# ---- CONNECT and its answer ----------------------------------------------------------------------


def test_connect_bytes_name_the_checked_address_and_carry_the_credentials() -> None:
    assert up.target("198.51.100.7", "a.test", 443, by_name=False) == "198.51.100.7:443"
    assert up.target("2001:db8::7", "a.test", 443, by_name=False) == "[2001:db8::7]:443"
    assert up.target("198.51.100.7", "a.test", 443, by_name=True) == "a.test:443"
    assert up.connect_request("198.51.100.7:443", P) == (
        b"CONNECT 198.51.100.7:443 HTTP/1.1\r\nHost: 198.51.100.7:443\r\n\r\n"
    )
    basic = base64.b64encode(b"u:p:w").decode()
    assert up.connect_request("[2001:db8::7]:443", Proxy("p", 1, "u:p:w")) == (
        b"CONNECT [2001:db8::7]:443 HTTP/1.1\r\nHost: [2001:db8::7]:443\r\n"
        + f"Proxy-Authorization: Basic {basic}\r\n\r\n".encode()
    )
    with pytest.raises(UpstreamError):
        up.connect_request("a.test:443\r\nX: y", P)


def test_answers_are_parsed_from_whole_heads_only() -> None:
    assert up.head_end(b"HTTP/1.1 200 OK\r\n") is None
    head = b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=x\r\n\r\n"
    assert up.head_end(head + b"body") == len(head)
    r = up.parse_reply(head)
    assert (r.status, r.reason, r.ok) == (407, "Proxy Authentication Required", False)
    assert up.parse_reply(b"HTTP/1.0 200 Connection established\r\n\r\n").ok
    assert up.parse_reply(b"HTTP/1.1 204\r\n\r\n") == up.Reply(204, "")
    assert not up.parse_reply(b"HTTP/1.1 302 Found\r\n\r\n").ok
    for bad in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 2000 x\r\n\r\n", b"HTTP/2 200\r\n\r\n", b"\r\n\r\n"):
        with pytest.raises(UpstreamError, match="did not answer CONNECT with HTTP"):
            up.parse_reply(bad)
    with pytest.raises(UpstreamError, match="no end within"):
        up.head_end(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 4000)
    assert up.parse_reply(b"HTTP/1.1 403 \x1b[31mred\r\n\r\n").reason == "[31mred"  # no terminal escapes


# ---- the spec ------------------------------------------------------------------------------------


def _spec(u: Upstream | None) -> spec.BindingSpec:
    return spec.BindingSpec("t1", NetworkPolicy(), upstream_proxy=u)


@pytest.mark.parametrize(
    "u",
    [
        None,
        Upstream(Proxy("p", 1, "u:pw"), None, "a.test"),
        Upstream(None, Proxy("::1", 8), "", True),
        Upstream(P, P, "*"),
    ],
)
def test_the_spec_carries_the_settings(u: Upstream | None) -> None:
    assert spec.decode(spec.encode(_spec(u))).upstream_proxy == u


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("http://p:1", "upstream_proxy must be null or an object"),
        ({"https": None, "http": None, "no_proxy": "", "by_name": False}, "names no proxy"),
        ({"https": None, "http": None, "no_proxy": ""}, "upstream_proxy must be null or an object"),
        ({"https": {"host": "p", "port": 0, "auth": None}, "http": None, "no_proxy": "", "by_name": False}, "port"),
        ({"https": {"host": "p", "port": True, "auth": None}, "http": None, "no_proxy": "", "by_name": False}, "port"),
        ({"https": {"host": "a b", "port": 1, "auth": None}, "http": None, "no_proxy": "", "by_name": False}, "host"),
        ({"https": {"host": "p", "port": 1, "auth": "a\nb"}, "http": None, "no_proxy": "", "by_name": False}, "auth"),
        ({"https": {"host": "p", "port": 1}, "http": None, "no_proxy": "", "by_name": False}, "exactly"),
        ({"https": {"host": "p", "port": 1, "auth": None}, "http": None, "no_proxy": 1, "by_name": False}, "no_proxy"),
    ],
)
def test_the_daemon_refuses_a_malformed_setting(value: object, says: str) -> None:
    d = spec.encode(_spec(None))
    d["upstream_proxy"] = value
    with pytest.raises(spec.SpecError, match=says):
        spec.decode(d)

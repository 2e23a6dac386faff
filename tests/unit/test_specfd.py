"""A bind's spec in a sealed memfd, its compact groups, and the daemon's cache of compiled policies."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
from collections.abc import Iterator

import pytest

from netguard import rules
from netguard.daemon import control, ctlasync, policycache, specbytes, specfd
from netguard.policy import NetworkPolicy, Rule, parse_network
from netguard.spec import GROUP_MIN, BindingSpec, Received, SpecError, decode, encode
from sgbase.origin import Origin

NAMES = [f"h{i}.example{i % 7}.test" for i in range(200)]
BIG = parse_network(
    {"allow": [*NAMES[:100], {"host": "*.w.test", "dns": ["TXT"]}, *NAMES[100:]], "deny": ["x.test"]}, "p.yaml"
)
SPEC = BindingSpec("task-1", BIG, approval_socket="/run/a.sock")


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def memfd(data: bytes, seals: int) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.fixture
def bind_fds() -> Iterator[list[int]]:
    fds = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in control.BIND_FDS]
    yield fds
    control.close_fds(fds)


# ---- the memfd --------------------------------------------------------------------------------


def test_sealed_round_trip_and_the_seals_hold() -> None:
    fd = specfd.sealed(b"spec bytes")
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & specfd.REQUIRED == specfd.REQUIRED
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"X", 0)  # nobody can change it after the daemon read it, not even the launcher
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 1)
    assert specfd.read_sealed(fd) == b"spec bytes" and not is_open(fd)


@pytest.mark.parametrize(
    ("seals", "fragment"),
    [
        (0, "not sealed"),
        (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, "not sealed"),  # still writable in place
        (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK, "not sealed"),  # may still grow
    ],
    ids=["unsealed", "writable", "growable"],
)
def test_an_unsealed_or_writable_memfd_is_refused_and_closed(seals: int, fragment: str) -> None:
    fd = memfd(b"x" * 10, seals)
    with pytest.raises(specfd.SpecFdError, match=fragment):
        specfd.read_sealed(fd)
    assert not is_open(fd)


def test_an_oversized_memfd_and_a_non_memfd_are_refused_and_closed(tmp_path: object) -> None:
    fd = specfd.sealed(b"x" * 1000)
    with pytest.raises(specfd.SpecFdError, match="1000 bytes, more than the 999"):
        specfd.read_sealed(fd, limit=999)
    assert not is_open(fd)
    r, w = os.pipe()
    with pytest.raises(specfd.SpecFdError, match="not a memfd"):
        specfd.read_sealed(r)
    assert not is_open(r)
    os.close(w)
    assert specfd.MAX_BYTES == 128 << 20


# ---- expanding a received bind ------------------------------------------------------------------


def test_expand_gives_the_bind_it_stands_for(bind_fds: list[int]) -> None:
    msg, fd = specfd.bind_request(SPEC)
    data = json.dumps(msg).encode()
    assert specfd.names_memfd(data, [*bind_fds, fd])
    got, fds, flags = specfd.expand(data, [*bind_fds, fd], 0)
    assert fds == bind_fds and flags == 0 and not is_open(fd)
    parsed = control.parse_message(got, flags)
    assert set(parsed) == {"op", "spec"} and isinstance(parsed["spec"], Received)
    assert decode(parsed["spec"]) == SPEC


@pytest.mark.parametrize("case", ["too few fds", "wrong index", "unsealed", "not a spec", "bad policy"])
def test_a_bad_memfd_bind_is_one_error_and_every_fd_is_closed(case: str) -> None:
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in control.BIND_FDS]
    good = specbytes.to_bytes(SPEC)
    index = specfd.MEMFD_INDEX
    if case == "too few fds":
        fds.pop()
        fds.append(specfd.sealed(good))
    elif case == "wrong index":
        index = 0
        fds.append(specfd.sealed(good))
    elif case == "unsealed":
        fds.append(memfd(good, 0))
    elif case == "not a spec":
        fds.append(specfd.sealed(b"garbage"))
    else:
        fds.append(specfd.sealed(good.replace(b"h1.example1.test", b"H1.example1.test")))
    data = json.dumps({"op": "bind", "spec": {"memfd": index}}).encode()
    got, left, _ = specfd.expand(data, list(fds), 0)
    assert left == [] and not any(is_open(fd) for fd in fds)
    with pytest.raises(ValueError) as e:
        control.parse_message(got, 0)
    assert str(e.value)  # the text the daemon replies with


def test_an_unexpected_failure_still_closes_every_fd(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(data: bytes) -> NetworkPolicy:
        raise RuntimeError("bug")

    monkeypatch.setattr(policycache.CACHE, "policy", boom)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in control.BIND_FDS]
    msg, fd = specfd.bind_request(SPEC)
    with pytest.raises(RuntimeError):
        specfd.expand(json.dumps(msg).encode(), [*fds, fd], 0)
    assert not any(is_open(x) for x in (*fds, fd))


def test_other_messages_pass_unchanged() -> None:
    for data in (b'{"op": "status"}', b"not json", b"[1]", b'{"op": "bind", "spec": {"task": "x"}}'):
        assert specfd.expand(data, [], 0) == (data, [], 0)


def test_ctlasync_expands_off_the_loop_and_refuse_never_reads_a_memfd(bind_fds: list[int]) -> None:
    asyncio.run(_ctlasync(bind_fds))


async def _ctlasync(bind_fds: list[int]) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        b.setblocking(False)
        big = BindingSpec("big", parse_network({"allow": [f"h{i}.big.test" for i in range(5000)]}, "p.yaml"))
        for spec in (SPEC, big):  # decoded on the loop, then in a thread (over specfd.INLINE_BYTES)
            msg, fd = specfd.bind_request(spec)
            assert specfd.small(fd) == (spec is SPEC)
            control.send_message(a, msg, [*bind_fds, fd])
            os.close(fd)
            data, fds, flags = await ctlasync.recv(b)
            assert decode(control.parse_message(data, flags)["spec"]) == spec
            control.close_fds(fds)
        msg, fd = specfd.bind_request(SPEC)
        control.send_message(a, msg, [fd])
        os.close(fd)
        data, fds, _ = await ctlasync.recv_unexpanded(b)
        assert not isinstance(data, specfd.Expanded) and len(fds) == 1
        control.close_fds(fds)


# ---- the compact groups of the spec --------------------------------------------------------------


def test_long_runs_travel_as_groups_and_decode_to_the_same_rules() -> None:
    enc = encode(SPEC)
    allow = enc["policy"]["allow"]
    assert [("values" in x) for x in allow] == [True, False, True]  # 100 names, the dns wildcard, 100 names
    assert allow[0]["origin"] == "p.yaml" and allow[0]["lines"] == "\n" * 99  # no line: empty lines
    assert decode(enc) == SPEC
    small = BindingSpec("t", parse_network({"allow": NAMES[: GROUP_MIN - 1]}, "p.yaml"))
    assert all("values" not in x for x in encode(small)["policy"]["allow"])  # small policies: one dict a rule


def test_names_and_wildcards_mixed_as_in_a_hosts_file_travel_as_one_group() -> None:
    """A threat feed or a bench list mixes `*.suffix` lines among names: one group, not 10^5 dicts."""
    names = [f"*.w{i}.example.test" if i % 8 == 7 else f"h{i}.example.test" for i in range(200)]
    spec = BindingSpec("t", parse_network({"allow": names}, "p.yaml"))
    allow = encode(spec)["policy"]["allow"]
    assert len(allow) == 1 and allow[0]["kind"] == "names" and allow[0]["values"].split("\n")[7] == "*.w7.example.test"
    assert decode(encode(spec)) == spec
    assert [r.kind for r in spec.policy.allow[:8]] == ["host"] * 7 + ["wildcard"]


def test_origins_with_lines_and_odd_file_names_survive() -> None:
    rs = tuple(Rule("host", n, None, Origin("dir:with:colons/f.txt", i + 1)) for i, n in enumerate(NAMES[:40]))
    odd = (Rule("host", "odd.test", None, Origin("new\nline")), Rule("host", "odd2.test", None, Origin("a:1\n2", 3)))
    spec = BindingSpec("t", NetworkPolicy(deny=(*rs[:20], *odd, *rs[20:])))
    assert decode(encode(spec)) == spec
    assert specbytes.policy_from_bytes(specbytes.split_bytes(specbytes.to_bytes(spec))[1]) == spec.policy


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("values", "\n".join(["H0.example0.test", *NAMES[1:100]]), "not in canonical form"),
        ("lines", "1\n2", "differ in number"),
        ("kind", "cidr", "kind must be 'names'"),
        ("ports", [0], "port numbers"),
        ("origin", "x" * 5000, "longer than"),
    ],
)
def test_a_bad_group_is_refused(field: str, value: object, fragment: str) -> None:
    enc = encode(SPEC)
    enc["policy"]["allow"][0][field] = value
    with pytest.raises(SpecError, match=fragment):
        decode(enc)


# ---- the daemon's compile cache -------------------------------------------------------------------


def policy_bytes(n: int, tag: str) -> bytes:
    pol = parse_network({"allow": [f"h{i}.{tag}.test" for i in range(n)]}, "p.yaml")
    return specbytes.split_bytes(specbytes.to_bytes(BindingSpec("t", pol)))[1]


def test_same_bytes_same_compiled_policy_and_lru_bounds() -> None:
    cache = policycache.PolicyCache(max_entries=2, max_names=250, min_rules=50)
    a, b, c, small = policy_bytes(100, "a"), policy_bytes(100, "b"), policy_bytes(100, "c"), policy_bytes(10, "s")
    pa = cache.policy(a)
    assert cache.policy(a) is pa and rules.compile_policy(pa) is rules.compile_policy(cache.policy(a))
    assert (cache.hits, cache.misses) == (2, 1)
    cache.policy(small)
    cache.policy(small)
    assert len(cache) == 1 and cache.misses == 3  # not kept: decoding it costs less than keeping it
    cache.policy(b)
    cache.policy(a)  # a is now the most recent
    cache.policy(c)  # over two entries: b goes
    assert len(cache) == 2 and cache.policy(a) is pa
    misses = cache.misses
    cache.policy(b)
    assert cache.misses == misses + 1
    big = policycache.PolicyCache(max_entries=4, max_names=250, min_rules=50)
    for x in (a, b, c):
        big.policy(x)
    assert len(big) == 2  # 300 names would pass max_names: the oldest went
    with pytest.raises(SpecError):
        cache.policy(b"{}")

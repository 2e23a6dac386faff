"""Issue 24's verify probes (selftest/probes/requestshape.py, inspected.sentinel_prefix) judged
on canned replies: a trick served is a bypass, only sandgate's 403 is a refusal, a failed control means
the probe cannot tell. (Run end to end by tests/e2e/test_verify.py, against the real daemon.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from selftest.probes import inspected, requestshape
from selftest.probes.core import Ctx, Unsupported
from selftest.spec import VerifySpec

HELLO = b"hello from api.verify.test\n"
REFUSAL = inspected.REFUSED + b"POST /x on api.verify.test: path is not canonical (rule verify.yaml:14)\n"


def ctx(probe: str, **spec: Any) -> Ctx:
    fields = {"api_host": "api.verify.test", "marker_tag": "root", "cred_env": "SG_TEST_KEY", "cred_sha256": "0"}
    return Ctx(cast(VerifySpec, SimpleNamespace(**fields, **spec)), "child", probe)


class Upstream:
    """Stands in for the exchange through the proxy: answers each request by `answer(method, target, headers)`."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    def __call__(self, host: str, asks: list[tuple[str, str, dict[str, str]]]) -> tuple[list[tuple[int, bytes]], int]:
        self.asked += asks
        return [self.answer(*a) for a in asks], 1


def sandgate(method: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """What the daemon does: only the controls (their paths say control-, never the probe's marker) are served."""
    return (200, HELLO) if "/control-" in target else (403, REFUSAL)


PROBES = {
    "path_spellings": requestshape.path_spellings,
    "method_override": requestshape.method_override,
    "websocket_upgrade": requestshape.websocket_upgrade,
}


@pytest.mark.parametrize("name", PROBES)
def test_every_trick_refused_by_sandgate_is_blocked(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    up = Upstream(sandgate)
    monkeypatch.setattr(requestshape, "exchange", up)
    observed, detail = PROBES[name](ctx(name))
    assert observed == "blocked" and "on 1 connection(s)" in detail, detail
    tricks = [a for a in up.asked if sandgate(*a)[0] == 403]
    assert tricks and all(f"/verify/child-root/{name}" in t for _, t, _ in tricks)  # the canary would see the marker


def test_the_tricks_are_the_issues(monkeypatch: pytest.MonkeyPatch) -> None:
    up = Upstream(sandgate)
    monkeypatch.setattr(requestshape, "exchange", up)
    requestshape.path_spellings(ctx("path_spellings"))
    requestshape.method_override(ctx("method_override"))
    targets = " ".join(t for _, t, _ in up.asked)
    for spelling in requestshape.SPELLINGS:
        assert spelling + "/verify/child-root/path_spellings" in targets
    headers = {h for _, _, hs in up.asked for h in hs}
    assert set(requestshape.OVERRIDES) <= headers and "_method=DELETE" in targets


@pytest.mark.parametrize("name", PROBES)
def test_one_trick_served_is_a_bypass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    served = {"n": 0}

    def leaky(method: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
        status, body = sandgate(method, target, headers)
        if status == 403 and not served["n"]:
            served["n"] = 1
            return 200, HELLO  # an upstream that got it
        return status, body

    monkeypatch.setattr(requestshape, "exchange", Upstream(leaky))
    assert PROBES[name](ctx(name))[0] == "permitted"


@pytest.mark.parametrize("name", PROBES)
def test_a_failed_control_or_someone_elses_403_cannot_tell(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requestshape, "exchange", Upstream(lambda m, t, h: (502, b"bad gateway")))
    with pytest.raises(Unsupported, match="was not served"):
        PROBES[name](ctx(name))

    def upstream_403(method: str, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
        status, _ = sandgate(method, target, headers)
        return (403, b"Forbidden") if status == 403 else (200, HELLO)

    monkeypatch.setattr(requestshape, "exchange", Upstream(upstream_403))
    assert PROBES[name](ctx(name))[0] == "unsupported"


def test_sentinel_prefix_finds_the_secrets_start_in_the_sentinel(monkeypatch: pytest.MonkeyPatch) -> None:
    c = ctx("sentinel_prefix", cred_prefix="verifyreal-")
    monkeypatch.setattr(inspected, "exchange", Upstream(lambda m, t, h: (200, HELLO)))
    monkeypatch.setenv("SG_TEST_KEY", "sandgate-sentinel-" + "0f" * 16)
    observed, detail = inspected.sentinel_prefix(c)
    assert observed == "blocked" and "starts with none of the secret" in detail
    monkeypatch.setenv("SG_TEST_KEY", "verifyreal-sandgate-sentinel-" + "0f" * 16)  # what v2 made of it
    observed, detail = inspected.sentinel_prefix(c)
    assert observed == "permitted" and "'verifyreal-', the secret's first 11" in detail
    monkeypatch.setattr(inspected, "exchange", Upstream(lambda m, t, h: (403, b"no")))
    with pytest.raises(Unsupported, match="not served"):  # the control: the sentinel must work at its host
        inspected.sentinel_prefix(c)
    monkeypatch.delenv("SG_TEST_KEY")
    with pytest.raises(Unsupported, match="is not set inside"):
        inspected.sentinel_prefix(c)

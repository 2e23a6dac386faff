"""Issue 24's request probes: requests an upstream would read as another one than the rules judged.

Verify's API host allows any GET, POST under /v1/, and WebSocket upgrades under /v1/ws/ only
(selftest/inspectnet.py). Each probe sends its tricks on one kept-alive connection through
the explicit proxy, between allowed controls on the same connection, and counts a trick refused only
by sandgate's own 403 naming the rule. Each trick carries the probe's marker in its path, so a
trick that reached the upstream canary fails the row whatever the probe saw. Stdlib only.
"""

from __future__ import annotations

from selftest import markers
from selftest.probes.core import Ctx, Result, combine, probe
from selftest.probes.inspected import INSPECTION_CONTEXTS, REFUSED, Ask, controls, exchange, refusal

#: The review's spellings: with `/v1/**` each reached the upstream with the brokered credential
#: (nginx decodes %2F before resolving '..', Tomcat reads '..;' as '..', IIS reads '\\' as '/').
SPELLINGS = (
    "/v1/..%2fadmin",
    "/v1/a%2f..%2f..%2fadmin",
    "/v1/%2e%2e%2fadmin",
    "/v1/..%5cadmin",
    "/v1/..;/admin",
    "/v1/%252e%252e/admin",
    "/v1/%c0%ae%c0%ae/admin",
)
OVERRIDES = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")
WEBSOCKET = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


Trick = tuple[str, Ask]  # what the detail calls it, the request


def _judged(c: Ctx, control: str, tricks: list[Trick], last: Ask | None = None) -> Result:
    """The tricks between two allowed POSTs to `control` (then `last`, another allowed request)."""
    ok: Ask = ("POST", control, {})
    asks = [ok, *(ask for _, ask in tricks), ok, *([last] if last else [])]
    replies, opened = exchange(c.spec.api_host, asks)
    labels = ["POST under /v1/", "POST under /v1/ after", *(["upgrade under /v1/ws/"] if last else [])]
    controls(c.spec.api_host, [replies[0], *replies[len(tricks) + 1 :]], labels)
    parts = [(label, refusal(*replies[i + 1], REFUSED)) for i, (label, _) in enumerate(tricks)]
    observed, detail = combine(parts, need="any")
    return observed, f"{len(asks)} requests on {opened} connection(s); {detail}"


@probe("network", "path_spellings", "blocked", contexts=INSPECTION_CONTEXTS)
def path_spellings(c: Ctx) -> Result:
    """Path spellings servers read differently (..%2f, %2e%2e, ..%5c, ..;, %252e, overlong UTF-8) under POST /v1/**."""
    control = "/v1" + markers.control_path(c.mark, c.probe)
    return _judged(c, control, [(s, ("POST", s + c.path, {})) for s in SPELLINGS])


@probe("network", "method_override", "blocked", contexts=INSPECTION_CONTEXTS)
def method_override(c: Ctx) -> Result:
    """A permitted POST with X-HTTP-Method-Override (and kin) or ?_method=: a DELETE to frameworks that honour it."""
    control = "/v1" + markers.control_path(c.mark, c.probe)
    tricks: list[Trick] = [(h, ("POST", f"/v1{c.path}/{i}", {h: "DELETE"})) for i, h in enumerate(OVERRIDES)]
    tricks.append(("_method", ("POST", f"/v1{c.path}/query?_method=DELETE", {})))
    return _judged(c, control, tricks)


@probe("network", "websocket_upgrade", "blocked", contexts=INSPECTION_CONTEXTS)
def websocket_upgrade(c: Ctx) -> Result:
    """A WebSocket (or h2c) upgrade where no http rule says websocket: true: after an upgrade nothing is judged."""
    control = "/v1" + markers.control_path(c.mark, c.probe)
    tricks: list[Trick] = [
        ("websocket", ("GET", f"/v1{c.path}/ws", WEBSOCKET)),  # read-only covers the GET, no rule the upgrade
        ("h2c", ("GET", f"/v1/ws{c.path}/h2c", {"Connection": "Upgrade", "Upgrade": "h2c"})),
    ]
    allowed: Ask = ("GET", "/v1/ws" + markers.control_path(c.mark, c.probe), WEBSOCKET)  # a rule says so
    return _judged(c, control, tricks, last=allowed)

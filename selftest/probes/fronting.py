"""Fronting on an inspected connection: a request whose Host header names the credential's bound
host, sent on a TLS connection to another inspected host. A broker that took the Host header for
where the credential may go, while the bytes go where the connection goes, would hand the real
secret to the other host. Stdlib only.

The explicit-proxy part carries the probe's marker (it must be refused: the sentinel on another
host's connection). The transparent part does not: there the Host header names the destination,
so reaching the bound host itself is the right outcome; what must never happen is the other
upstream getting the request, which verify judges from that upstream's log (the real secret or a
sentinel in it fails the row whatever the probe saw).
"""

from __future__ import annotations

import http.client
import ssl

from selftest.probes.core import Ctx, Result, attempt, combine, probe
from selftest.probes.inspected import LEAK, REFUSED, exchange, refusal, sentinel_of
from selftest.probes.netio import BODY_LIMIT, HTTP_TIMEOUT, USER_AGENT, net_failure, says


def _via_proxy(c: Ctx, sentinel: str) -> Result:
    """CONNECT the other host, then name the bound host in Host: the tunnel's host decides."""
    headers = {"Host": c.spec.api_host, "Authorization": f"Bearer {sentinel}"}
    ((status, body),), _ = exchange(c.spec.other_host, [("GET", f"{c.path}/fronted", headers)])
    if status == 403 and body.startswith(REFUSED):
        return refusal(status, body, REFUSED)
    return refusal(status, body, LEAK)


def _transparent(c: Ctx, sentinel: str) -> Result:
    """TLS to the other host's address and name (SNI), Host naming the bound host: never the other upstream."""
    conn = http.client.HTTPSConnection(
        c.spec.other_host, 443, timeout=HTTP_TIMEOUT, context=ssl.create_default_context()
    )
    headers = {"Host": c.spec.api_host, "User-Agent": USER_AGENT, "Authorization": f"Bearer {sentinel}"}
    try:
        conn.request("GET", f"/v1/fronted/{c.mark}", headers=headers)
        resp = conn.getresponse()
        status, body = resp.status, resp.read(BODY_LIMIT)
    except OSError as e:
        raise net_failure(e) from e
    finally:
        conn.close()
    if says(body, c.spec.other_host):
        return "permitted", f"HTTP {status} from {c.spec.other_host}, with the bound host's Host header"
    if says(body, c.spec.api_host):
        return "blocked", f"HTTP {status} from {c.spec.api_host} itself: the Host header named the destination"
    return refusal(status, body, REFUSED if body.startswith(REFUSED) else LEAK)


@probe("network", "credential_fronting", "blocked")
def credential_fronting(c: Ctx) -> Result:
    """The bound host named in the Host header on another inspected host's connection: the secret must not follow."""
    sentinel = sentinel_of(c)
    return combine(
        [
            ("explicit proxy", attempt(_via_proxy, c, sentinel)),
            ("transparent", attempt(_transparent, c, sentinel)),
        ],
        need="any",
    )

"""Leaf certificates for inspected hosts, issued from the run's CA (netguard.spec.CaPair).

The CA pair is parsed once per sandbox (an Issuer); each host name gets its own leaf, with a
fresh EC P-256 key, cached so a busy host is not re-signed per connection. The certificates
themselves are netguard.tlscerts's (the one place their extensions are defined). Pure: nothing is
read from or written to disk; a leaf's key lives only in this process.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from netguard import tlscerts

LEAF_DAYS = 7  # a leaf outlives no run by much; it is also clipped to the CA's validity
MAX_CACHED = 256  # leaves kept per sandbox: a client naming endless hosts cannot grow memory without bound
_BACKDATE = datetime.timedelta(hours=1)  # tolerate a client clock slightly behind ours
_ORG = "sandgate inspection"

LeafError = tlscerts.CertError  # the CA pair is unusable or the name is not one


@dataclass(frozen=True)
class Leaf:
    """A server certificate for one name and its private key (never serialised by this module)."""

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


class Issuer:
    """Signs leaves with one sandbox's CA; parse the pair once, then `leaf(name)` per connection."""

    def __init__(self, cert_pem: str, key_pem: str, *, max_cached: int = MAX_CACHED) -> None:
        self._authority = tlscerts.load(cert_pem, key_pem)
        self.ca = self._authority.cert
        self.max_cached = max_cached
        self._cache: OrderedDict[str, Leaf] = OrderedDict()

    def leaf(self, name: str, now: datetime.datetime | None = None) -> Leaf:
        """The cached leaf for `name`, issued anew when missing or within a day of expiring."""
        now = now or datetime.datetime.now(datetime.UTC)
        hit = self._cache.get(name)
        if hit is not None and hit.cert.not_valid_after_utc - now > datetime.timedelta(days=1):
            self._cache.move_to_end(name)
            return hit
        leaf = self._issue(name, now)
        self._cache[name] = leaf
        self._cache.move_to_end(name)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return leaf

    def _issue(self, name: str, now: datetime.datetime) -> Leaf:
        alt = tlscerts.general_name(name)  # the one name asked for: never a wildcard
        valid = tlscerts.within(
            self._authority, tlscerts.Validity(now - _BACKDATE, now + datetime.timedelta(days=LEAF_DAYS)), now
        )
        cn = alt.value if isinstance(alt, x509.DNSName) else str(alt.value)
        subject = tlscerts.subject(_ORG, cn if len(cn) <= tlscerts.MAX_CN else None)  # clients match on the SAN
        key = tlscerts.new_key()
        return Leaf(name, tlscerts.leaf(self._authority, key, subject, [alt], valid), key)

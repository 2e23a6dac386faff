"""Public suffixes: where a proposed wildcard must stop (`*.co.uk`, `*.github.io` would open strangers' sites)."""

from __future__ import annotations

import functools

from publicsuffix2 import PublicSuffixList


@functools.lru_cache(maxsize=1)
def _psl() -> PublicSuffixList:
    return PublicSuffixList()


def public_suffix(name: str) -> str | None:
    """The public suffix of a DNS name (`co.uk`, `github.io`; an unknown TLD is its own suffix, per the PSL's `*` rule)."""
    return _psl().get_tld(name.lower().rstrip("."), wildcard=True, strict=False) or None


def registrable_domain(name: str) -> str | None:
    """The public suffix plus one label (`example.co.uk`), or None if `name` is itself a public suffix.

    Not `get_sld`: for TLDs missing from the list it answers the TLD itself
    (`a.b.internal` -> `internal`), which would make `*.internal` look registrable.
    """
    name = name.lower().rstrip(".")
    suffix = public_suffix(name)
    if suffix is None:
        return None
    labels = name.split(".")
    n = suffix.count(".") + 1
    if len(labels) <= n:
        return None
    return ".".join(labels[-(n + 1) :])

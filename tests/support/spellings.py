"""Issue 24's request-path spellings and method-override headers: the tests' one oracle of them.

Each spelling reached an upstream under `GET /v1/**` with the brokered credential (nginx decodes %2F
before resolving '..', Tomcat reads '..;' as '..', IIS reads '\\' as '/'). Kept apart from the
product's own list (selftest/probes/requestshape.py) on purpose: a test that read the
product's list would pass with a list shortened to nothing.
"""

from __future__ import annotations

ISSUE_SPELLINGS = (
    "/v1/..%2fadmin",
    "/v1/a%2f..%2f..%2fadmin",
    "/v1/%2e%2e%2fadmin",
    "/v1/..%5cadmin",
    "/v1/..;/admin",
    "/v1/%252e%252e/admin",
    "/v1/%c0%ae%c0%ae/admin",
)
OVERRIDES = ("X-HTTP-Method-Override", "X-HTTP-Method", "x-method-override")

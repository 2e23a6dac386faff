"""Credential brokering: secrets the proxy adds on egress, which the sandbox never holds. Pure: no I/O.

    network:
      credentials:
        - host: api.openai.com
          header: Authorization               # the default
          value: "Bearer ${OPENAI_API_KEY}"   # the secret: the launcher's $OPENAI_API_KEY ...
        - host: npm.example.test
          value: "Bearer ${NPM_TOKEN}"
          file: ~/.config/sandgate/npm-token  # ... or this file's content (hidden inside)

Inside the sandbox the variable holds a per-run sentinel, so an SDK that insists on a key still
starts. The proxy inspects the bound host and, only on requests to it over verified TLS, sets the
header (and swaps the sentinel wherever else a header carries it). A sentinel sent anywhere else
(another host, plain HTTP) is refused and recorded as an attempted leak. The real value lives in
the launcher and the daemon only: never in the sandbox's environment, files or the audit log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from netguard import hosts
from sgbase.origin import Origin
from sgbase.policyerror import PolicyError, line_of

CREDENTIAL_KEYS = ("host", "header", "value", "file")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Headers that frame or route the request: a credential in them would change where it goes.
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"})
#: The public prefixes vendors put on every token of a kind: the only part of a secret a sentinel keeps,
#: so an SDK's format check still passes. A fixed list, not a pattern: a pattern kept up to 11
#: characters of any secret (`REALSECRET-...`). Longest match wins (`sk-proj-` over `sk-`). No AWS
#: `AKIA`: an access key id is no bearer secret, and SigV4 signs each request with the secret key,
#: which no header template can broker.
VENDOR_PREFIXES: tuple[str, ...] = (
    "sk-", "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-ant-", "sk-or-v1-",  # OpenAI, Anthropic, OpenRouter
    "sk_live_", "sk_test_", "rk_live_", "rk_test_",  # Stripe
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",  # GitHub
    "glpat-", "npm_", "pypi-", "dckr_pat_",  # GitLab, npm, PyPI, Docker Hub
    "xoxb-", "xoxp-", "xapp-",  # Slack
    "hf_", "gsk_", "xai-", "pplx-", "r8_", "AIza",  # Hugging Face, Groq, xAI, Perplexity, Replicate, Google
)  # fmt: skip
#: Shorter secrets are refused: a short one turns up in ordinary traffic (with `x`, every request
#: holding an `x` was an "attempted leak" and every `x` in a response masked).
MIN_SECRET = 16


@dataclass(frozen=True)
class Credential:
    """A credential as the policy names it: where it goes and where its secret comes from (no secret)."""

    host: str  # canonical exact name: a credential is bound to one host, never a wildcard
    header: str
    template: str  # the header value with one ${VARIABLE}
    variable: str  # the variable the sandbox sees, holding the sentinel
    file: str | None  # the secret's source instead of the launcher's environment
    origin: Origin

    def __post_init__(self) -> None:
        found = _VAR.findall(self.template) if isinstance(self.template, str) else []
        why = _binding_problem(self.host, self.header, self.variable, self.origin) or (
            "the template must hold exactly one ${VARIABLE}, this one, and no line break"
            if found != [self.variable] or "\r" in self.template or "\n" in self.template
            else "file must be null or a path"
            if self.file is not None and (not isinstance(self.file, str) or not self.file.strip())
            else None
        )
        if why is not None:
            raise PolicyError(f"credential: {why}", origin=self.origin if type(self.origin) is Origin else None)


@dataclass(frozen=True)
class Secret:
    """A credential as the daemon holds it: the rendered header, the real value and its sentinel.

    Checked when made, so the daemon's decoder only builds it: a header value with a line break would
    inject headers, a raw host would never match, an empty sentinel or secret would match everything.
    """

    host: str
    header: str
    value: str  # the whole header value, secret included
    real: str
    sentinel: str
    variable: str
    origin: Origin

    def __post_init__(self) -> None:
        texts = (self.value, self.real, self.sentinel)
        why = _binding_problem(self.host, self.header, self.variable, self.origin) or (
            "empty sentinel or secret, or a line break in the header value"
            if not all(isinstance(t, str) for t in texts)
            or not self.sentinel
            or not self.real
            or self.real not in self.value
            or any(c in self.value for c in "\r\n\0")
            else None
        )
        if why is not None:
            raise PolicyError(f"secret: {why}", origin=self.origin if type(self.origin) is Origin else None)


def _binding_problem(host: object, header: object, variable: object, origin: object) -> str | None:
    """What Credential and Secret share: one canonical host, a header a credential can go in, a variable."""
    if type(origin) is not Origin:
        return f"the origin is an Origin record, not {type(origin).__name__}"
    if not isinstance(header, str) or not _HEADER.fullmatch(header) or header.lower() in _FRAMING:
        return f"header {header!r} is not a header a credential can go in"
    if not isinstance(variable, str) or not _NAME.fullmatch(variable):
        return f"variable {variable!r} is not a variable name"
    if not isinstance(host, str):
        return f"host is a name, not {type(host).__name__}"
    try:
        canonical = hosts.normalise_name(host)
    except hosts.HostError as e:
        return f"host: {e}"
    return None if canonical == host else f"host {host!r} is not in canonical form ({canonical!r})"


def parse_credentials(section: Any, source: str, line: int | None) -> tuple[Credential, ...]:
    """`network.credentials`: a list of mappings with host, value (and header, file)."""
    if section is None:
        return ()
    if not isinstance(section, list):
        raise PolicyError("'network.credentials' must be a list of {host, header, value} mappings", line)
    out = tuple(_parse_one(item, source, line_of(section, i) or line) for i, item in enumerate(section))
    seen: dict[tuple[str, str], Origin] = {}
    for c in out:
        key = (c.host, c.header.lower())
        if key in seen:
            raise PolicyError(
                f"two credentials for header {c.header} on {c.host} ({seen[key]} and {c.origin}); keep one"
            )
        seen[key] = c.origin
    return out


def _parse_one(item: Any, source: str, line: int | None) -> Credential:
    if not isinstance(item, dict):
        raise PolicyError("a credential is a mapping with host, header, value (and file)", line)
    for key in item:
        if key not in CREDENTIAL_KEYS:
            raise PolicyError(
                f"unknown key '{key}' in a credential (expected {', '.join(CREDENTIAL_KEYS)})", line_of(item, key)
            )
    for key in ("host", "value"):
        if not isinstance(item.get(key), str):
            raise PolicyError(f"a credential needs '{key}' as a string", line_of(item, key) or line)
    host = item["host"]
    if "*" in host:
        raise PolicyError(
            f"credential host '{host}': bind a credential to one host name", line_of(item, "host") or line
        )
    try:
        name = hosts.normalise(host)
    except hosts.HostError as e:
        raise PolicyError(f"credential host '{host}': {e}", line_of(item, "host") or line) from None
    if not isinstance(name, str):
        raise PolicyError(
            f"credential host '{host}': bind a credential to one host name", line_of(item, "host") or line
        )
    header = item.get("header", "Authorization")
    if not isinstance(header, str) or not _HEADER.fullmatch(header) or header.lower() in _FRAMING:
        raise PolicyError(
            f"credential header {header!r} is not a header a credential can go in", line_of(item, "header")
        )
    value = item["value"]
    found = _VAR.findall(value)
    if len(found) != 1 or "\r" in value or "\n" in value:
        raise PolicyError(
            f"credential value {value!r} must hold exactly one ${{VARIABLE}} ('Bearer ${{OPENAI_API_KEY}}')",
            line_of(item, "value") or line,
        )
    file = item.get("file")
    if file is not None and (not isinstance(file, str) or not file.strip()):
        raise PolicyError("credential 'file' must be a path", line_of(item, "file"))
    return Credential(name, header, value, found[0], file, Origin(source, line))


def render(c: Credential, secret: str) -> str:
    """The header value with the secret in place of its variable."""
    return _VAR.sub(lambda _: secret, c.template)


def vendor_prefix(secret: str) -> str:
    """The longest of VENDOR_PREFIXES that `secret` starts with, else ""."""
    return max((p for p in VENDOR_PREFIXES if secret.startswith(p)), key=len, default="")


def sentinel_for(secret: str, token: str) -> str:
    """What the sandbox sees instead of `secret`: its public vendor prefix (if any) and a random token."""
    return f"{vendor_prefix(secret)}sandgate-sentinel-{token}"


def too_short(secret: str) -> str | None:
    """Why `secret` cannot be brokered (shorter than MIN_SECRET), or None."""
    if len(secret) >= MIN_SECRET:
        return None
    chars = f"{len(secret)} character{'s' if len(secret) != 1 else ''}"
    return (
        f"the secret is {chars}; at least {MIN_SECRET} are needed (a shorter one turns up in ordinary"
        " traffic, where every request holding it would be refused as a leak)"
    )


def carried(text: str, secrets: tuple[Secret, ...]) -> Secret | None:
    """The secret whose sentinel (or real value) `text` carries, if any: a leak unless bound there."""
    for s in secrets:
        if s.sentinel in text or (s.real and s.real in text):
            return s
    return None


def leak_reason(s: Secret, host: str, where: str) -> str:
    """The refusal text of an attempted leak (never the value itself)."""
    return f"attempted leak: the sentinel of ${s.variable} (bound to {s.host}) sent to {host} in {where}"

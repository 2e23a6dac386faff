"""The `env:` section: which environment variables a sandboxed command never sees.

A variable is dropped when its NAME looks like a credential or its VALUE carries one; a
secret in the environment is one `curl` away from an allowed host. Pure: names and values
in, a filtered copy and the dropped names out (never the values: they go to the audit log
and the terminal).

Precedence, first match wins:

1. `env.keep` (the user's patterns): kept, whatever the name or value.
2. `env.drop` (the user's patterns): dropped.
3. The value carries a credential (SECRET_VALUES): dropped, even for a name in DEFAULT_ENV_KEEP
   (a well-known name does not make its value safe).
4. DEFAULT_ENV_KEEP: well-known non-secrets a name pattern would otherwise catch
   (AWS_CA_BUNDLE, PWD, ...): kept.
5. DEFAULT_ENV_DROP: dropped.

Name patterns are shell-style (`*`, `?`, `[...]`) and match the whole name, case-insensitively
for every list, the user's too (`openai_api_key` is as secret as `OPENAI_API_KEY`).

Values are dropped for:

- a URL with a password, whatever the variable's name: `scheme://user:password@host`
  (DATABASE_URL, REDIS_URL, PIP_INDEX_URL, a proxy with credentials). A user without a
  password (`ssh://git@host`) is not a secret; a token used as the user is caught by its format;
- a connection string with a `Password=`/`Pwd=`/`AccountKey=`/`SharedAccessKey=` field;
- a PEM private key;
- a token in a well-known format anywhere in the value: GitHub (`ghp_` `gho_` `ghu_` `ghs_`
  `ghr_` + 36, `github_pat_`), GitLab (`glpat-`), Slack (`xox?-`), OpenAI/Anthropic-style
  `sk-` + 20 or more, Stripe (`sk_live_`/`rk_test_`...), AWS access key ids (`AKIA`/`ASIA` + 16),
  npm (`npm_` + 36), PyPI (`pypi-AgE...`), Hugging Face (`hf_` + 30), Google API keys (`AIza` + 35),
  DigitalOcean (`dop_v1_` + 64 hex), and JSON Web Tokens (Kubernetes service-account tokens).

False positives are accepted on the side of dropping: a wrongly dropped variable costs one line
of `env.keep` (and `-v` names it); a wrongly kept one costs the secret. So `*_KEY` drops GPG_KEY
(a public fingerprint) and KUBECONFIG (a path) is dropped too, while the name families avoid
catching everyday names: `*_AUTH`/`*_AUTH_*` rather than `*_AUTH*` (GIT_AUTHOR_NAME), `*TOKEN` and
`*_TOKEN_*` rather than `*TOKEN*` (TOKENIZERS_PARALLELISM), `*_PWD` (PWD, OLDPWD are kept), `*_PASS`
(not BYPASS, SSH_ASKPASS). CI metadata (GITHUB_SHA, CI_COMMIT_REF_NAME) is kept; only credentials go.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from fsguard import gitcmdenv

#: Credential-looking names, in families first, then names the families miss.
DEFAULT_ENV_DROP: tuple[str, ...] = (
    # families
    "*_KEY",
    "*_KEYS",
    "*_KEY_*",
    "*API_KEY*",
    "*APIKEY*",
    "*KEYFILE*",
    "*TOKEN",
    "*_TOKEN_*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*PASSPHRASE*",
    "*_PWD",
    "*_PASS",
    "*CREDENTIAL*",
    "*_CREDS",
    "*_AUTH",
    "*_AUTH_*",
    "*AUTHTOKEN*",
    "*_PAT",
    "*_DSN",
    "*CONNECTION_STRING*",
    "*WEBHOOK*",
    "OTEL_EXPORTER_OTLP_*HEADERS",  # a collector's API key: sandgate's daemon sends it, the command never sees it
    # providers whose credentials have names no family catches (AWS_ACCESS_KEY_ID is caught,
    # AZURE_DEVOPS_EXT_PAT too; AZURE_USERNAME/AZURE_CLIENT_CERTIFICATE_PATH are not)
    "AWS_*",
    "AZURE_*",
    # one-offs: agent sockets (they sign with keys the sandbox must not use), tools' own names
    "SSH_AUTH_SOCK",
    "GPG_AGENT_INFO",
    "KUBECONFIG",
    "SSHPASS",
    "BW_SESSION",
    "OP_SESSION_*",
)

#: Well-known non-secrets that a name pattern above catches or might catch: CA bundles (a
#: TLS client inside needs them), the shell's working directories, AWS settings that are not keys.
DEFAULT_ENV_KEEP: tuple[str, ...] = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "PIP_CERT",
    "NIX_SSL_CERT_FILE",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "PWD",
    "OLDPWD",
)

#: Values that carry a credential, whatever the variable is called (see the module docstring).
SECRET_VALUES: tuple[str, ...] = (
    r"(?i:[a-z][a-z0-9+.-]*://[^\s/?#@:]*:[^\s/?#]+@)",  # scheme://user:password@
    r"(?i:(?:^|;)\s*(?:password|pwd|accountkey|sharedaccesskey)\s*=\s*[^;\s])",  # connection string
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY",
    r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36}",
    r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}",
    r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}",
    r"(?<![A-Za-z0-9_-])xox[abeoprs]-[A-Za-z0-9-]{10,}",
    r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}",
    r"(?<![A-Za-z0-9_])[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
    r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])",
    r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}",
    r"(?<![A-Za-z0-9_-])pypi-AgE[A-Za-z0-9_-]{16,}",
    r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}",
    r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}",
    r"(?<![A-Za-z0-9_])do[opr]_v1_[a-f0-9]{64}",
    r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.",  # a JWT: header.payload.
)


@dataclass(frozen=True)
class EnvPolicy:
    """The `env:` section: names dropped on top of the defaults, names always kept."""

    drop: tuple[str, ...] = ()  # in addition to DEFAULT_ENV_DROP
    keep: tuple[str, ...] = ()  # wins over every rule, the defaults' too


class NameMatcher:
    """Shell-style name patterns, case-insensitive. Plain `*` globs (all the defaults) are matched with
    string operations: compiling them into a regex cost every run a few milliseconds. `compiled`: all
    of them in one regex (~15x faster per name), for a process that matches for many runs (the fork
    server compiles the defaults once for all its runs, launcher/forkserver/)."""

    def __init__(self, patterns: Iterable[str], compiled: bool = False) -> None:
        self.simple: list[tuple[str, ...]] = []
        other: list[str] = []
        for p in patterns:
            up = p.upper()
            if compiled or "?" in up or "[" in up:
                other.append(fnmatch.translate(up))
            else:
                self.simple.append(tuple(up.split("*")))
        self.regex = re.compile("|".join(other)) if other else None

    def __bool__(self) -> bool:
        return bool(self.simple) or self.regex is not None

    def match(self, name: str) -> bool:
        up = name.upper()
        for parts in self.simple:
            if _glob(parts, up):
                return True
        return self.regex is not None and self.regex.match(up) is not None


def _glob(parts: tuple[str, ...], name: str) -> bool:
    """`name` matches the pattern that `"*".join(parts)` spells (only `*` wildcards)."""
    if len(parts) == 1:
        return name == parts[0]
    first, *middle, last = parts
    if not name.startswith(first) or not name.endswith(last) or len(name) < len(first) + len(last):
        return False
    pos, end = len(first), len(name) - len(last)
    for m in middle:
        pos = name.find(m, pos, end)
        if pos < 0:
            return False
        pos += len(m)
    return True


def names_matcher(patterns: Iterable[str]) -> NameMatcher | None:
    """A case-insensitive matcher for shell-style name patterns (None: no pattern, matches nothing)."""
    m = NameMatcher(patterns)
    return m if m else None


#: Literal pieces one of which every SECRET_VALUES match contains (upper-cased): values without
#: any skip the regex, and the regex is compiled only when some value needs it.
_VALUE_HINTS = (
    "@",
    "PASSWORD",
    "PWD",
    "ACCOUNTKEY",
    "SHAREDACCESSKEY",
    "PRIVATE KEY",
    "GHP_",
    "GHO_",
    "GHU_",
    "GHS_",
    "GHR_",
    "GITHUB_PAT_",
    "GLPAT-",
    "XOX",
    "SK-",
    "K_LIVE_",
    "K_TEST_",
    "AKIA",
    "ASIA",
    "NPM_",
    "PYPI-AGE",
    "HF_",
    "AIZA",
    "_V1_",
    "EYJ",
)


_COMPILED: list[tuple[NameMatcher, NameMatcher]] = []  # precompile_defaults(): the defaults as one regex each


@cache
def _defaults() -> tuple[NameMatcher, NameMatcher]:
    """Built once, on first use: most of sandgate never filters an environment."""
    return _COMPILED[0] if _COMPILED else (NameMatcher(DEFAULT_ENV_DROP), NameMatcher(DEFAULT_ENV_KEEP))


def precompile_defaults() -> None:
    """The default patterns compiled, for every filter this process (and its forks) will run."""
    _COMPILED[:] = [(NameMatcher(DEFAULT_ENV_DROP, compiled=True), NameMatcher(DEFAULT_ENV_KEEP, compiled=True))]
    _defaults.cache_clear()


@cache
def _values() -> re.Pattern[str]:
    return re.compile("|".join(SECRET_VALUES))


def _matches(matcher: NameMatcher | None, name: str) -> bool:
    return matcher is not None and matcher.match(name)


def value_is_secret(value: str) -> bool:
    """Whether the value carries a credential (a URL password, a key, a well-known token format)."""
    up = value.upper()
    if not any(h in up for h in _VALUE_HINTS):
        return False
    return _values().search(value) is not None


def _reason(name: str, value: str, user_keep: NameMatcher | None, user_drop: NameMatcher | None) -> str | None:
    drop, keep = _defaults()
    if _matches(user_keep, name):
        return None
    if _matches(user_drop, name):
        return "env.drop"
    if value_is_secret(value):
        return "value"
    if keep.match(name):
        return None
    if drop.match(name):
        return "name"
    return None


def why_dropped(name: str, value: str, policy: EnvPolicy = EnvPolicy()) -> str | None:
    """Why this variable is dropped: "env.drop", "value" or "name" (a default pattern); None: kept."""
    return _reason(name, value, names_matcher(policy.keep), names_matcher(policy.drop))


def filter_env(env: Mapping[str, str], policy: EnvPolicy = EnvPolicy()) -> tuple[dict[str, str], list[str]]:
    """(environment for the task, names dropped, sorted). Never returns or records a dropped value."""
    user_keep, user_drop = names_matcher(policy.keep), names_matcher(policy.drop)
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if _reason(name, value, user_keep, user_drop) is None:
            kept[name] = value
        else:
            dropped.append(name)
    if any(gitcmdenv.is_family(n) for n in dropped):  # git dies on a count without its keys: whole pairs only
        whole = gitcmdenv.with_entries(kept, gitcmdenv.entries(kept))
        dropped += [n for n in kept if n not in whole]
        kept = whole
    return kept, sorted(dropped)

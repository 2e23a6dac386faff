"""How much of an untrusted workspace policy to believe: only what forbids more.

A `./.sandgate.yaml` picked up implicitly comes with the checkout sandgate exists to distrust:
until the user runs `sandgate trust` (launcher/config/trust.py), only what it forbids applies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsguard import policy as fspolicy
from fsguard.env import EnvPolicy
from netguard import policy as netpolicy

if TYPE_CHECKING:
    from launcher.config.trust import Status

#: What an untrusted file keeps, per section: only what forbids more. Every other field, today's
#: and any added later, is dropped, so a new way to widen is ignored until it is listed here.
KEPT = {"network": ("deny",), "filesystem": ("read_deny", "protect"), "env": ("drop",)}


def _split(section: str, value: Any) -> tuple[dict[str, Any], list[str]]:
    """(the kept fields of a section, names of the other fields that are set)."""
    default = type(value)()
    kept = {name: getattr(value, name) for name in KEPT[section]}
    dropped = [
        f"{section}.{f.name}"
        for f in dataclasses.fields(value)
        if f.compare and f.name not in kept and getattr(value, f.name) != getattr(default, f.name)
    ]
    return kept, dropped


def narrow(
    net: netpolicy.NetworkPolicy, fs: fspolicy.FsPolicy, env: EnvPolicy, has_include: bool
) -> tuple[netpolicy.NetworkPolicy, fspolicy.FsPolicy, EnvPolicy, tuple[str, ...]]:
    """What an untrusted file may do: only forbid more. Returns the kept sections and the keys ignored.

    Kept: network.deny, filesystem.read_deny, env.drop, and filesystem.protect inside the workspace
    (a missing protected path gets a placeholder created on the host: outside the workspace that
    would let the file create files anywhere sandgate may, /etc/nologin say). Ignored, because each
    can widen: allow/ask rules (and with them `inspect:`/`http:`), a resolver, credentials (a
    checked-out repository must never choose where your secret is sent), includes (allowlists, and files the checkout names),
    env.keep, filesystem.unprotect, and filesystem.write, which widens even as a subset of the
    defaults ("." alone drops the private /tmp and shows the host's).
    """
    n, ignored = _split("network", net)
    f, dropped_fs = _split("filesystem", fs)
    e, dropped_env = _split("env", env)
    inside = tuple(p for p in fs.protect if not p.startswith(("/", "~")))
    outside = ["filesystem.protect outside the workspace"] if len(inside) < len(fs.protect) else []
    f["protect"] = inside
    ignored = [*(["include"] if has_include else []), *ignored, *dropped_fs, *outside, *dropped_env]
    return (netpolicy.NetworkPolicy(**n), fspolicy.FsPolicy(**f), EnvPolicy(**e), tuple(ignored))


@dataclass(frozen=True)
class Narrowed:
    """An untrusted workspace policy as applied: what was ignored, and why it was not trusted."""

    name: str  # as the user would type it
    status: Status
    ignored: tuple[str, ...]
    store_problem: str | None = None

    def notice(self) -> str:
        """The one line printed when something was ignored."""
        why = "changed since you trusted it" if self.status == "changed" else "is not trusted"
        extra = f" (trust records not used: {self.store_problem})" if self.store_problem else ""
        return (
            f"sandgate: {self.name} {why}{extra}, so only what it forbids applies; ignored: "
            f"{', '.join(self.ignored)}; to trust it: sandgate trust {self.name}"
        )

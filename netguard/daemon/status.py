"""The daemon's `status` reply, typed and checked (the control protocol's one structured answer)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class BindingStatus(TypedDict):
    task: str
    since: str  # RFC 3339 UTC


class Status(TypedDict):
    """The daemon's `status` reply, as `sandgate daemon status` shows it."""

    ok: bool
    pid: int
    uptime: float
    bindings: list[BindingStatus]
    mitmproxy: NotRequired[str]  # "loading" (a cold daemon serves before it is loaded), "ready" or "failed"


def parse_status(reply: dict[str, Any]) -> Status:
    """Check a `status` reply's shape: a daemon of other code must not make the launcher crash on a KeyError."""
    bindings = reply.get("bindings")
    ok = (
        isinstance(reply.get("pid"), int)
        and isinstance(reply.get("uptime"), int | float)
        and isinstance(bindings, list)
        and all(
            isinstance(b, dict) and isinstance(b.get("task"), str) and isinstance(b.get("since"), str) for b in bindings
        )
    )
    if not ok or not isinstance(bindings, list):
        raise ValueError("the daemon's status reply is malformed")
    st = Status(
        ok=True,
        pid=reply["pid"],
        uptime=float(reply["uptime"]),
        bindings=[BindingStatus(task=b["task"], since=b["since"]) for b in bindings],
    )
    if reply.get("mitmproxy") in ("loading", "ready", "failed"):
        st["mitmproxy"] = reply["mitmproxy"]
    return st

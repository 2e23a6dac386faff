"""Where sandgate keeps its Windows state, and the record `sandgate setup` leaves (pure).

All of it lives under the real user's own profile (`%LOCALAPPDATA%\\sandgate`): the sandbox user
cannot read another user's profile, and the sealed password is DPAPI user-scope on top of that.
The setup record names the sandbox user and SID, so `setup --remove` finds the derived WFP keys
and firewall names even when the user itself is already gone (a half-finished setup or removal).
"""

from __future__ import annotations

import hashlib
import json
import ntpath
from dataclasses import dataclass

#: The proxy's loopback port the persistent filters permit (plan.Host.explicit_port's default).
PROXY_PORT = 3128


class StateError(ValueError):
    """A setup record that is not one of ours: never guess which user or filters to remove."""


@dataclass(frozen=True)
class SetupRecord:
    name: str  # the sandbox user's account name
    sid: str  # its SID: the key of every WFP filter and firewall rule
    port: int  # the proxy port the filters permit
    #: (folder, "code"|"guard"): the deny ACEs on sandgate's own code folders (fsguard/windows/
    #: selfprotect.py, r2-ci C3), recorded before any is added so `setup --remove` takes out exactly those
    protected: tuple[tuple[str, str], ...] = ()


def root(appdata: str) -> str:
    return ntpath.join(appdata, "sandgate")


def sealed_password(appdata: str) -> str:
    return ntpath.join(root(appdata), "sandbox-user.bin")


def setup_record(appdata: str) -> str:
    return ntpath.join(root(appdata), "sandbox-user.json")


def journal_dir(appdata: str) -> str:
    return ntpath.join(root(appdata), "acl-journal")


def journal_path(appdata: str, pid: int, task: str) -> str:
    """One journal per run, named by the launcher's pid: a live run's journal is never replayed."""
    return ntpath.join(journal_dir(appdata), f"{pid}-{task}.jsonl")


def journal_pid(name: str) -> int | None:
    """The pid in a journal's file name; None: not a journal of ours (left alone)."""
    head, _, rest = name.partition("-")
    return int(head) if head.isdigit() and rest.endswith(".jsonl") else None


def audit_dir(appdata: str) -> str:
    return ntpath.join(root(appdata), "audit")


def sandbox_user_name(real_sid: str) -> str:
    """One sandbox user per real user (each seals its own password): <= 20 characters, as
    Windows account names must be, and the same on every setup (idempotent)."""
    return "sandgate-" + hashlib.sha256(real_sid.encode()).hexdigest()[:8]


def encode(record: SetupRecord) -> bytes:
    doc: dict[str, object] = {"name": record.name, "sid": record.sid, "port": record.port}
    if record.protected:  # absent when empty: a record of an older setup reads the same
        doc["protected"] = [list(p) for p in record.protected]
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> SetupRecord:
    try:
        raw = json.loads(data)
        record = SetupRecord(raw["name"], raw["sid"], raw["port"], _protected(raw.get("protected", [])))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StateError("unreadable setup record") from None
    if not (isinstance(record.name, str) and isinstance(record.sid, str) and isinstance(record.port, int)):
        raise StateError("setup record with fields of the wrong type")
    return record


def _protected(raw: object) -> tuple[tuple[str, str], ...]:
    """[[folder, kind], ...] exactly: never guess which ACEs `setup --remove` takes out."""
    if not isinstance(raw, list):
        raise TypeError("protected")
    out = []
    for item in raw:
        if not (
            isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[1] in ("code", "guard")
        ):
            raise TypeError("protected")
        out.append((item[0], str(item[1])))
    return tuple(out)

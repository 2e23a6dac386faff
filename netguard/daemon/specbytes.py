"""A BindingSpec as bytes (what the launcher seals into a memfd), with its policy kept apart.

Layout: MAGIC, the spec without its policy as one JSON line, then the policy's JSON. The daemon
hashes exactly the policy's bytes to find an already decoded and compiled policy
(netguard.daemon.policycache): several sandboxes of one user bind the same big policy, and each
bind's own parts (task, approval socket, secrets) never enter the hash. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from netguard.policy import NetworkPolicy
from netguard.spec import BindingSpec, SpecError, decode_policy, encode

MAGIC = b"sandgate-spec/1\n"


def to_bytes(spec: BindingSpec) -> bytes:
    """MAGIC + the spec without its policy (one line: JSON escapes every newline) + the policy's JSON."""
    d = encode(spec)
    policy = json.dumps(d.pop("policy"), separators=(",", ":")).encode()
    return MAGIC + json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" + policy


def split_bytes(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(the spec without its policy, the policy's bytes) of to_bytes' output; SpecError otherwise."""
    if not data.startswith(MAGIC):
        raise SpecError("not a sandgate spec (wrong or missing header)")
    head, nl, policy = data[len(MAGIC) :].partition(b"\n")
    try:
        header = json.loads(head) if nl else None
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise SpecError("the spec's first line is not a JSON object")
    return header, policy


def policy_from_bytes(data: bytes) -> NetworkPolicy:
    """The policy part of to_bytes' output, checked as strictly as spec.decode checks it."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise SpecError("policy is not JSON") from None
    return decode_policy(obj)

"""The canary markers: how a probe signs its traffic, and how verify finds that signature again.

One definition for both sides. Inside the sandbox a probe puts its marker on everything it sends
(probes/core.py, Ctx); outside, verify searches the canary logs and the host for the same strings
(judge.py, planted.py, staged.py). A marker spelled differently on one side would make a bypass
invisible: the blocked row would pass while the canary logged the probe's data.

    mark          <context>-<tag>  (the tag is the pass: "root" or "user"; no tag: <context>)
    HTTP          the request path /verify/<mark>/<probe>
    TCP/UDP/unix  the payload verify:<mark>:<probe>\\n
    DNS           the label <probe>-<mark> (lower case, "_" -> "-") below the exfil domain

Stdlib only: the probe runner imports this inside the sandbox, whose Python may have nothing else.
"""

from __future__ import annotations

import hashlib


def mark(context: str, tag: str = "") -> str:
    """The context as markers spell it: `<context>-<tag>` when verify runs passes, else the context."""
    return f"{context}-{tag}" if tag else context


def http_path(mark: str, probe: str) -> str:
    """HTTP marker: the request path."""
    return f"/verify/{mark}/{probe}"


def control_path(mark: str, probe: str) -> str:
    """HTTP marker of a probe's permitted twin (the allowed request beside the attack): never matched by
    in_logs(probe, ...), so the twin reaching its canary is no evidence against the blocked row."""
    return f"/verify/{mark}/control-{probe}"


def payload(mark: str, probe: str) -> str:
    """TCP/UDP/unix marker, as text (the wire form ends with a newline: wire_payload)."""
    return f"verify:{mark}:{probe}"


def wire_payload(mark: str, probe: str) -> bytes:
    """TCP/UDP/unix marker: the bytes a probe sends."""
    return (payload(mark, probe) + "\n").encode()


def tag_trace(tag: str) -> str:
    """What every payload of one pass holds, whatever its context: `-<tag>:`."""
    return f"-{tag}:"


def probe_trace(probe: str) -> str:
    """What every payload of one probe ends with, whatever its context and pass: `:<probe>`."""
    return f":{probe}"


def dns_label(text: str) -> str:
    """Lowercase, [a-z0-9-] only: a safe DNS label (not length-checked)."""
    return "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower())


def label(probe: str, mark: str) -> str:
    """DNS marker: `<probe>-<mark>`, lowercase and label-safe."""
    return dns_label(f"{probe}-{mark}")


def dns_name(probe: str, mark: str, domain: str) -> str:
    """DNS marker as a full name: `<label>.<domain>`."""
    return f"{label(probe, mark)}.{domain}"


def exfil_name(secret: str, context: str, domain: str) -> str:
    """`<hex of secret>-<context>.<domain>`, the first part cut into 63-byte labels if longer."""
    first = dns_label(f"{secret.encode().hex()}-{context}")
    labels = [first[i : i + 63] for i in range(0, len(first), 63)]
    return ".".join([*labels, domain])


def case_name(name: str, mark: str) -> str:
    """`name` in a letter case spelled from `mark` (never all lower): how verify recognises it upstream."""
    bits = int.from_bytes(hashlib.sha256(mark.encode()).digest(), "big") | 1
    out = [ch.upper() if ch.isalpha() and (bits >> i) & 1 else ch for i, ch in enumerate(name)]
    return "".join(out)


def wild_control_name(label: str, wild_domain: str) -> str:
    """The control name of wildcard_dns_types: `<label>-a.<wild domain>` (not the marker `<label>.`)."""
    return f"{label}-a.{wild_domain}"


def disk_node(mark: str) -> str:
    """The block node mknod_disk leaves in the workspace: verify looks for it after the run."""
    return f"sandgate-disk-{mark}"


def in_logs(probe: str, mark: str) -> tuple[str, ...]:
    """How a probe's traffic is recognised in a canary's log records (searched as JSON text)."""
    return (
        http_path(mark, probe),
        payload(mark, probe),
        label(probe, mark) + ".",  # a DNS query name, as the probe spelled it below any domain
        f"{probe}-{mark}.",
    )

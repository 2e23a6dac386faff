"""Editing a DACL in SDDL form: add one ACE in canonical order, take out one trustee's ACEs.

Why canonical order matters: Windows evaluates ACEs in order, and the documented order is
explicit deny, explicit allow, inherited deny, inherited allow. A deny-write ACE appended after
an allow would be evaluated too late to deny anything. Pure text work on what win32.dacl_sddl
returns; conditional ACEs (with parentheses inside) are kept whole, never split.
"""

from __future__ import annotations


class SddlError(ValueError):
    """Text that is not a DACL this module understands: never guess at an ACL."""


def split_dacl(sddl: str) -> tuple[str, list[str]]:
    """`D:AI(A;;FA;;;SY)(...)` -> ("D:AI", ["(A;;FA;;;SY)", ...]), parentheses matched by depth."""
    if not sddl.startswith("D:"):
        raise SddlError("expected a DACL in SDDL form (D:...)")
    start = sddl.find("(")
    head, aces, depth, begin = sddl if start < 0 else sddl[:start], [], 0, 0
    flags = head[2:]
    for token in ("NO_ACCESS_CONTROL", "AI", "AR", "P"):  # the DACL control flags SDDL has
        flags = flags.replace(token, "")
    if flags:
        raise SddlError(f"unknown DACL flags in {head!r}")
    if start < 0:
        return head, []
    for i in range(start, len(sddl)):
        ch = sddl[i]
        if ch == "(":
            depth += 1
            if depth == 1:
                begin = i
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SddlError("unbalanced parentheses in the DACL")
            if depth == 0:
                aces.append(sddl[begin : i + 1])
        elif depth == 0:
            raise SddlError("text between ACEs in the DACL")
    if depth:
        raise SddlError("unbalanced parentheses in the DACL")
    return head, aces


def fields(ace: str) -> list[str]:
    """An ACE's fields (type;flags;rights;object;inherit-object;trustee[;condition])."""
    body, out, depth, cur = ace[1:-1], [], 0, ""
    for ch in body:
        if ch == ";" and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    out.append(cur)
    if len(out) < 6:
        raise SddlError(f"ACE with {len(out)} fields: {ace!r}")
    return out


def _explicit_deny(ace: str) -> bool:
    f = fields(ace)
    return f[0] in ("D", "OD", "XD") and "ID" not in f[1]


def with_ace(sddl: str, ace: str) -> str:
    """The DACL with `ace` added where canonical order puts it: a deny first, an allow after the
    explicit denies (so before every other explicit allow and every inherited ACE)."""
    head, aces = split_dacl(sddl)
    if "NO_ACCESS_CONTROL" in head:  # a NULL DACL grants everyone everything
        raise SddlError("a NULL DACL: adding an ACE would lock out everyone else; refusing")
    fields(ace)  # refuse a malformed ACE before it reaches SetNamedSecurityInfo
    if ace in aces:
        return sddl
    at = 0 if _explicit_deny(ace) else sum(1 for _ in _leading(aces))
    return head + "".join([*aces[:at], ace, *aces[at:]])


def _leading(aces: list[str]) -> list[str]:
    out = []
    for a in aces:
        if not _explicit_deny(a):
            break
        out.append(a)
    return out


def without_sid(sddl: str, sid: str) -> str:
    """The DACL with every ACE whose trustee is exactly `sid` taken out (and nobody else's)."""
    head, aces = split_dacl(sddl)
    return head + "".join(a for a in aces if fields(a)[5] != sid)

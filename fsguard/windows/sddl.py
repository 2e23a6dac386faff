"""Editing a DACL in SDDL form: add one ACE in canonical order, take out one trustee's ACEs.

Why canonical order matters: Windows evaluates ACEs in order, and the documented order is
explicit deny, explicit allow, inherited deny, inherited allow. A deny-write ACE appended after
an allow would be evaluated too late to deny anything. Pure text work on what win32.dacl_sddl
returns; conditional ACEs (with parentheses inside) are kept whole, never split.

Comparisons are semantic (`same_dacl`, `same_ace`): Windows stores the binary ACL and writes SDDL
back in its own spelling (a right as `FA` or `0x1f01ff`, a SID as `SY` or `S-1-5-18`, flags in its
order, `AI` added by SetNamedSecurityInfo), so text equality would call an untouched DACL changed
(issue 28 M4). https://learn.microsoft.com/en-us/windows/win32/secauthz/ace-strings
"""

from __future__ import annotations

from dataclasses import dataclass

#: SDDL right codes (ace-strings page above; FA/FR/FW/FX are the file rights, KA.. the key rights).
RIGHTS = {
    "GA": 0x10000000, "GR": 0x80000000, "GW": 0x40000000, "GX": 0x20000000,
    "RC": 0x20000, "SD": 0x10000, "WD": 0x40000, "WO": 0x80000,
    "RP": 0x10, "WP": 0x20, "CC": 0x1, "DC": 0x2, "LC": 0x4, "SW": 0x8, "LO": 0x80, "DT": 0x40, "CR": 0x100,
    "FA": 0x1F01FF, "FR": 0x120089, "FW": 0x120116, "FX": 0x1200A0,
    "KA": 0xF003F, "KR": 0x20019, "KW": 0x20006, "KX": 0x20019,
}  # fmt: skip
#: SID aliases Windows writes for well-known SIDs (https://learn.microsoft.com/en-us/windows/win32/secauthz/sid-strings).
SID_ALIASES = {
    "SY": "S-1-5-18", "BA": "S-1-5-32-544", "BU": "S-1-5-32-545", "BG": "S-1-5-32-546", "PU": "S-1-5-32-547",
    "WD": "S-1-1-0", "AU": "S-1-5-11", "AN": "S-1-5-7", "IU": "S-1-5-4", "NU": "S-1-5-2", "SU": "S-1-5-6",
    "PS": "S-1-5-10", "RC": "S-1-5-12", "LS": "S-1-5-19", "NS": "S-1-5-20", "CO": "S-1-3-0", "CG": "S-1-3-1",
    "OW": "S-1-3-4", "AC": "S-1-15-2-1",
}  # fmt: skip
ACE_FLAGS = ("OI", "CI", "NP", "IO", "ID", "SA", "FA", "TP", "CR")


@dataclass(frozen=True)
class ParsedAce:
    """One ACE by meaning: what Windows keeps in the binary ACL, whatever the SDDL spelling."""

    kind: str
    flags: frozenset[str]
    mask: int
    object_guid: str
    inherit_guid: str
    sid: str
    condition: str


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
    return f[0].upper() in ("D", "OD", "XD") and "ID" not in _flags(f[1])


def with_ace(sddl: str, ace: str) -> str:
    """The DACL with `ace` added where canonical order puts it: a deny first, an allow after the
    explicit denies (so before every other explicit allow and every inherited ACE)."""
    head, aces = split_dacl(sddl)
    if "NO_ACCESS_CONTROL" in head:  # a NULL DACL grants everyone everything
        raise SddlError("a NULL DACL: adding an ACE would lock out everyone else; refusing")
    new = parse_ace(ace)  # refuse a malformed ACE before it reaches SetNamedSecurityInfo
    if any(parse_ace(a) == new for a in aces):  # by meaning: Windows may have respelled ours
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
    return head + "".join(a for a in aces if sid_of(fields(a)[5]) != sid_of(sid))


def parse_ace(ace: str) -> ParsedAce:
    """`(D;CIOI;0xD0156;;;SY)` -> its meaning; SddlError for a right, flag or SID we cannot read."""
    f = fields(ace)
    return ParsedAce(
        f[0].upper(),
        _flags(f[1]),
        _mask(f[2]),
        f[3].lower(),
        f[4].lower(),
        sid_of(f[5]),
        ";".join(f[6:]),
    )


def _flags(text: str) -> frozenset[str]:
    pairs = [text[i : i + 2].upper() for i in range(0, len(text), 2)]
    if len(text) % 2 or any(p not in ACE_FLAGS for p in pairs):
        raise SddlError(f"unknown ACE flags {text!r}")
    return frozenset(pairs)


def _mask(text: str) -> int:
    try:
        return int(text, 0)  # 0x1301bf, or decimal
    except ValueError:
        pass
    codes = [text[i : i + 2].upper() for i in range(0, len(text), 2)]
    if not text or len(text) % 2 or any(c not in RIGHTS for c in codes):
        raise SddlError(f"unknown access rights {text!r}")
    mask = 0
    for c in codes:
        mask |= RIGHTS[c]
    return mask


def sid_of(text: str) -> str:
    """A trustee as a SID string: aliases resolved, `s-1-…` upper-cased as Windows writes it."""
    return SID_ALIASES.get(text.upper(), text.upper() if text.upper().startswith("S-1-") else text)


def same_ace(a: str, b: str) -> bool:
    return parse_ace(a) == parse_ace(b)


def same_dacl(a: str, b: str) -> bool:
    """Same protection and the same explicit ACEs in the same order. Inherited ACEs are the parent's
    (recomputed whenever it changes) and `AI`/`AR` are bookkeeping SetNamedSecurityInfo sets, so
    neither tells whether somebody changed THIS object's DACL; `P` (inheritance blocked) does."""
    head_a, aces_a = split_dacl(a)
    head_b, aces_b = split_dacl(b)
    if ("NO_ACCESS_CONTROL" in head_a) != ("NO_ACCESS_CONTROL" in head_b):
        return False
    if ("P" in head_a.replace("NO_ACCESS_CONTROL", "")) != ("P" in head_b.replace("NO_ACCESS_CONTROL", "")):
        return False
    return _explicit(aces_a) == _explicit(aces_b)


def _explicit(aces: list[str]) -> list[ParsedAce]:
    return [p for p in map(parse_ace, aces) if "ID" not in p.flags]


def same_inheritable(a: str, b: str) -> bool:
    """Nothing below the object changes between DACLs `a` and `b`: the same protection and the same
    explicit ACEs that children inherit (OI/CI). Then the DACL may be written to the object alone
    (win32.set_dacl_sddl(walk=False)), without the walk that rewrites every object below it."""
    head_a, aces_a = split_dacl(a)
    head_b, aces_b = split_dacl(b)
    if ("P" in head_a.replace("NO_ACCESS_CONTROL", "")) != ("P" in head_b.replace("NO_ACCESS_CONTROL", "")):
        return False
    return _inheritable(aces_a) == _inheritable(aces_b)


def _inheritable(aces: list[str]) -> list[ParsedAce]:
    return [p for p in _explicit(aces) if p.flags & {"OI", "CI"}]

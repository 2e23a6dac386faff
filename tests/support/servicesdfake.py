r"""The fake WinApi's WMI namespace and DCOM limit security descriptors (issue 28, H3), with the
documented contracts enforced, and the access check the services make against them.

Mixed into winfake.FakeWinApi (which supplies `_hit`, `admin` and `m.sds`). Contracts:
- SetSD needs WRITE_DAC (administrators), keeps only the non-inherited ACEs, CONTAINER_INHERIT
  ACEs reach child namespaces; refused: no DACL, no owner and group, an unknown access bit,
  INHERIT_ONLY without CONTAINER_INHERIT.
  https://learn.microsoft.com/en-us/windows/win32/wmisdk/--systemsecurity-setsd
- HKLM\SOFTWARE\Microsoft\Ole is writable by administrators only.
  https://learn.microsoft.com/en-us/windows/win32/sysinfo/registry-key-security-and-access-rights
- A COM ACL grants COM_RIGHTS_EXECUTE in every ACE and never mixes the old (EXECUTE-only) and the
  new format: https://learn.microsoft.com/en-us/windows/win32/com/access-control-lists-for-com
- Every DACL written must be in canonical order (explicit deny, explicit allow, inherited deny,
  inherited allow): https://learn.microsoft.com/en-us/windows/win32/secauthz/order-of-aces-in-a-dacl
- The access check walks the ACEs in order; the first deny of a wanted bit refuses, access is
  granted once allows cover every wanted bit, else refused (nothing granted is denied):
  https://learn.microsoft.com/en-us/windows/win32/secauthz/how-dacls-control-access-to-an-object
"""

from __future__ import annotations

from fsguard.windows import sddl, servicedeny
from sgbase.windows.api import WinApiError

#: Roughly what a Windows 10/11 machine holds (root's ACEs inherited by root\cimv2; DCOM limits as
#: documented: admins local+remote, Everyone local launch/activation).
DEFAULT_SDS = {
    "wmi:root": "O:BAG:BAD:(A;CI;CCDCLCSWRPWPRCWD;;;BA)(A;CI;CCDCRP;;;NS)(A;CI;CCDCRP;;;LS)(A;CI;CCDCRP;;;AU)",
    "wmi:root\\cimv2": "O:BAG:BAD:",
    "com:MachineLaunchRestriction": "O:BAG:BAD:(A;;CCDCLCSWRP;;;BA)(A;;CCDCSW;;;WD)(A;;CCDCLCSWRP;;;S-1-5-32-562)",
    "com:MachineAccessRestriction": "O:BAG:BAD:(A;;CCDCLC;;;WD)(A;;CCDCLC;;;S-1-5-32-562)(A;;CCDC;;;AN)",
}
#: WBEM_SECURITY_FLAGS 0x1..0x80 plus the standard rights (DELETE, READ_CONTROL, WRITE_DAC, WRITE_OWNER).
WMI_KNOWN_BITS = 0xFF | 0xF0000
#: Who a sandbox user's token holds besides its own SID (Everyone, Authenticated Users, Users, INTERACTIVE).
TOKEN_GROUPS = ("S-1-1-0", "S-1-5-11", "S-1-5-32-545", "S-1-5-4")


def default_sds() -> dict[str, str]:
    return dict(DEFAULT_SDS)


def _canonical(dacl: str, what: str) -> None:
    rank = [(("ID" in p.flags) * 2 + (p.kind not in ("D", "OD", "XD"))) for p in _parsed(dacl)]
    if rank != sorted(rank):
        raise WinApiError(f"{what}: DACL not in canonical order (a deny after an allow is evaluated too late)")


def _parsed(dacl: str) -> list[sddl.ParsedAce]:
    return [sddl.parse_ace(a) for a in sddl.split_dacl(dacl)[1]]


def _check_wmi_sd(sd: str, namespace: str) -> str:
    """SetSD's WBEM_E_INVALID_PARAMETER cases; returns the DACL with inherited ACEs dropped."""
    what = f"SetSD({namespace})"
    if not (sd.startswith("O:") and "G:" in sd.split("D:")[0]):
        raise WinApiError(f"{what}: WBEM_E_INVALID_PARAMETER (owner and group missing)")
    head, dacl, tail = servicedeny.split(sd)
    _canonical(dacl, what)
    flags, aces = sddl.split_dacl(dacl)
    for p in map(sddl.parse_ace, aces):
        if p.mask & ~WMI_KNOWN_BITS or ("IO" in p.flags and "CI" not in p.flags):
            raise WinApiError(f"{what}: WBEM_E_INVALID_PARAMETER (ACE {p})")
    return head + flags + "".join(a for a in aces if "ID" not in sddl.parse_ace(a).flags) + tail


def _check_com_sd(sd: str, value: str) -> None:
    """Windows: "COM_RIGHTS_EXECUTE must always be present" and "you must not mix the old format and the new
    format within a single ACL": either every ACE grants EXECUTE alone, or every ACE EXECUTE with
    LOCAL/REMOTE bits. https://learn.microsoft.com/en-us/windows/win32/com/access-control-lists-for-com"""
    masks = [p.mask & servicedeny.COM_LAUNCH_DENIED for p in _parsed(servicedeny.split(sd)[1])]
    if any(not m & servicedeny.COM_RIGHTS_EXECUTE for m in masks):
        raise WinApiError(f"{value}: invalid COM security descriptor (an ACE without COM_RIGHTS_EXECUTE)")
    if len({m == servicedeny.COM_RIGHTS_EXECUTE for m in masks}) > 1:
        raise WinApiError(f"{value}: invalid COM security descriptor (old and new ACE formats mixed)")


class ServiceSdFake:
    """WMI GetSD/SetSD and the Ole restriction values over `self.m.sds`."""

    admin: bool

    def _hit(self, name: str, *args: object) -> None:  # pragma: no cover - FakeWinApi's
        raise NotImplementedError

    def _sds(self) -> dict[str, str]:
        sds: dict[str, str] = self.m.sds  # type: ignore[attr-defined]
        return sds

    def wmi_namespace_sd(self, namespace: str) -> str:
        self._hit("wmi_namespace_sd", namespace)
        return self._full(namespace)

    def _full(self, namespace: str) -> str:
        own = self._sds().get("wmi:" + namespace.lower())
        if own is None:
            raise WinApiError(f"GetSD({namespace}): WBEM_E_INVALID_NAMESPACE")
        return own + "".join(self._inherited(namespace))

    def _inherited(self, namespace: str) -> list[str]:
        """The parent namespaces' CONTAINER_INHERIT ACEs, as this namespace sees them (ID)."""
        parent, _, _ = namespace.lower().rpartition("\\")
        if not parent:
            return []
        _, dacl, _ = servicedeny.split(self._full(parent))
        out = []
        for a in sddl.split_dacl(dacl)[1]:
            f = sddl.fields(a)
            if "CI" in sddl.parse_ace(a).flags:
                out.append("(" + ";".join([f[0], "CIID", *f[2:]]) + ")")
        return out

    def set_wmi_namespace_sd(self, namespace: str, sd: str) -> None:
        self._hit("set_wmi_namespace_sd", namespace, sd)
        if not self.admin:
            raise WinApiError(f"SetSD({namespace}): WBEM_E_ACCESS_DENIED (needs WRITE_DAC)")
        if "wmi:" + namespace.lower() not in self._sds():
            raise WinApiError(f"SetSD({namespace}): WBEM_E_INVALID_NAMESPACE")
        self._sds()["wmi:" + namespace.lower()] = _check_wmi_sd(sd, namespace)

    def com_restriction_sd(self, value: str) -> str | None:
        self._hit("com_restriction_sd", value)
        return self._sds().get("com:" + value)

    def set_com_restriction_sd(self, value: str, sd: str) -> None:
        self._hit("set_com_restriction_sd", value, sd)
        if not self.admin:
            raise WinApiError(f"RegSetValueExW(HKLM\\SOFTWARE\\Microsoft\\Ole\\{value}): access denied")
        _canonical(servicedeny.split(sd)[1], value)
        _check_com_sd(sd, value)
        self._sds()["com:" + value] = sd

    # what the services decide, by the access check
    def wmi_allows(self, sid: str, namespace: str, wanted: int) -> bool:
        """WMI's namespace check for a caller holding `sid` (and the usual user groups)."""
        return _access(self._full(namespace), sid, wanted)

    def com_allows(self, sid: str, value: str, wanted: int) -> bool:
        sd = self._sds().get("com:" + value)
        return sd is not None and _access(sd, sid, wanted)


def _access(sd: str, sid: str, wanted: int) -> bool:
    who = {sddl.sid_of(sid), *TOKEN_GROUPS}
    granted = 0
    for p in _parsed(servicedeny.split(sd)[1]):
        if p.sid not in who or "IO" in p.flags:
            continue
        if p.kind == "D" and p.mask & wanted & ~granted:
            return False
        if p.kind == "A":
            granted |= p.mask & wanted
            if granted == wanted:
                return True
    return False

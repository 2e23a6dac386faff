"""A fake Base Filtering Engine behind win32wfp's `fn`: the real ctypes structures go in, and the
documented WFP contract decides what comes back (issue 28: W2, M1, M7, M8).

Enforced, each with its page:
- FwpmFilterGetByKey0 needs FWPM_ACTRL_READ on the filter; BFE's default security grants Everyone
  only FWPM_ACTRL_OPEN and FWPM_ACTRL_CLASSIFY, Administrators GENERIC_ALL
  (https://learn.microsoft.com/en-us/windows/win32/api/fwpmu/nf-fwpmu-fwpmfiltergetbykey0,
  https://learn.microsoft.com/en-us/windows/win32/fwp/access-control).
- Adding needs FWPM_ACTRL_ADD on the container (administrators by default); a key that exists is
  FWP_E_ALREADY_EXISTS (https://learn.microsoft.com/en-us/windows/win32/api/fwpmu/nf-fwpmu-fwpmfilteradd0).
- Deleting a missing object is FWP_E_*_NOT_FOUND; a sublayer or provider that filters still
  reference is FWP_E_IN_USE (https://learn.microsoft.com/en-us/windows/win32/fwp/wfp-error-codes).
- A dynamic session's filters vanish when it closes
  (https://learn.microsoft.com/en-us/windows/win32/api/fwpmtypes/ns-fwpmtypes-fwpm_session0).
- Descriptors from ConvertStringSecurityDescriptorToSecurityDescriptorW are LocalAlloc'd and must be
  LocalFree'd (https://learn.microsoft.com/en-us/windows/win32/api/sddl/nf-sddl-convertstringsecuritydescriptortosecuritydescriptorw).
- Every call has exactly the arguments its win32calls entry declares; void functions return None.
"""

from __future__ import annotations

import ctypes
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from netguard.windows import wfp, win32wfp
from sgbase.windows import win32calls

ACCESS_DENIED = 5
#: https://learn.microsoft.com/en-us/windows/win32/api/fwpmu/nf-fwpmu-fwpmfreememory0: `void FwpmFreeMemory0(void **p)`
VOID = {"FwpmFreeMemory0"}


@dataclass
class Filter:
    key: str
    sublayer: str
    provider: str
    sddl: str | None
    flags: int
    session: int | None  # the dynamic session that owns it


@dataclass
class Engine:
    """The machine's BFE; `caller` is the calling token's user SID, `elevated` its Administrators."""

    caller: str
    elevated: bool = True
    filters: dict[str, Filter] = field(default_factory=dict)
    sublayers: set[str] = field(default_factory=set)
    providers: set[str] = field(default_factory=set)
    sessions: dict[int, bool] = field(default_factory=dict)  # handle -> dynamic
    live_sds: dict[int, str] = field(default_factory=dict)  # LocalAlloc'd descriptors not yet freed
    bfe_memory: dict[int, str] = field(default_factory=dict)  # BFE-allocated, for FwpmFreeMemory0
    fail_add: int | None = None  # the n-th FwpmFilterAdd0 returns this code
    adds: int = 0
    calls: list[str] = field(default_factory=list)
    _next: int = 0x1000
    _txn: tuple[dict[str, Filter], set[str], set[str]] | None = None

    def fn(self, name: str) -> Callable[..., Any]:
        call = win32calls.BY_NAME[name]
        impl = getattr(self, "_" + name)

        def bound(*args: Any) -> Any:
            assert len(args) == len(call.argtypes), f"{name}: {len(args)} arguments, declared {len(call.argtypes)}"
            self.calls.append(name)
            out = impl(*args)
            # void functions (their pages say so): a declared result type would read garbage (M1)
            assert name not in VOID or call.restype is None, f"{name} returns void; its restype must be None"
            return out

        return bound

    def _handle(self) -> int:
        self._next += 8
        return self._next

    def _may(self, sddl: str | None, right: int) -> bool:
        """An access check against an object's SDDL (None: the inherited default, admins only)."""
        if self.elevated:
            return True
        for rights, trustee in re.findall(r"\(A;[^;]*;([^;]*);;;([^)]*)\)", sddl or ""):
            if trustee == self.caller and (rights == "GA" or int(rights, 16) & right):
                return True
        return False

    # ---- the functions ----
    def _FwpmEngineOpen0(self, server: Any, authn: int, auth: Any, session: Any, out: Any) -> int:
        h = self._handle()
        self.sessions[h] = bool(session._obj.flags & 1) if session is not None else False
        out._obj.value = h
        return 0

    def _FwpmEngineClose0(self, engine: int) -> int:
        if self.sessions.pop(engine, False):
            self.filters = {k: f for k, f in self.filters.items() if f.session != engine}
        return 0

    # an aborted transaction leaves the engine as it was (all or nothing):
    # https://learn.microsoft.com/en-us/windows/win32/fwp/object-management
    def _FwpmTransactionBegin0(self, engine: int, flags: int) -> int:
        self._txn = (dict(self.filters), set(self.sublayers), set(self.providers))
        return 0

    def _FwpmTransactionCommit0(self, engine: int) -> int:
        self._txn = None
        return 0

    def _FwpmTransactionAbort0(self, engine: int) -> int:
        if self._txn is not None:
            self.filters, self.sublayers, self.providers = self._txn
        self._txn = None
        return 0

    def _FwpmProviderAdd0(self, engine: int, prov: Any, sd: Any) -> int:
        if not self.elevated:
            return ACCESS_DENIED
        key = _guid(prov._obj.providerKey)
        if key in self.providers:
            return win32wfp.FWP_E_ALREADY_EXISTS
        self.providers.add(key)
        return 0

    def _FwpmSubLayerAdd0(self, engine: int, sub: Any, sd: Any) -> int:
        if not self.elevated:
            return ACCESS_DENIED
        key = _guid(sub._obj.subLayerKey)
        if key in self.sublayers:
            return win32wfp.FWP_E_ALREADY_EXISTS
        self.sublayers.add(key)
        return 0

    def _FwpmFilterAdd0(self, engine: int, flt: Any, sd: Any, fid: Any) -> int:
        self.adds += 1
        if self.fail_add is not None and self.adds == self.fail_add:
            return 0x80320035  # FWP_E_INVALID_PARAMETER
        f = flt._obj
        if not self.elevated:
            return ACCESS_DENIED
        if not _valid_filter(f):
            return 0x80320035  # FWP_E_INVALID_PARAMETER (the exact FWP_E_* code is not modelled)
        key = _guid(f.filterKey)
        if key in self.filters:
            return win32wfp.FWP_E_ALREADY_EXISTS
        sddl = None
        if sd is not None:
            sddl = self.live_sds[int(sd.value)]  # a freed descriptor here would be a use after free
        dynamic = self.sessions.get(engine, False)
        self.filters[key] = Filter(
            key, _guid(f.subLayerKey), _guid(f.providerKey.contents), sddl, int(f.flags), engine if dynamic else None
        )
        return 0

    def _FwpmFilterGetByKey0(self, engine: int, key: Any, out: Any) -> int:
        f = self.filters.get(_guid(key._obj))
        if f is None:
            return win32wfp.FWP_E_FILTER_NOT_FOUND
        if not self._may(f.sddl, 0x80):  # FWPM_ACTRL_READ
            return ACCESS_DENIED
        out._obj.value = self._handle()
        return 0

    def _FwpmFreeMemory0(self, p: Any) -> None:
        self.bfe_memory.pop(int(p._obj.value or 0), None)
        return None

    # https://learn.microsoft.com/en-us/windows/win32/api/fwpmu/nf-fwpmu-fwpmfiltergetsecurityinfobykey0:
    # reading an object's security needs READ_CONTROL on it (standard rights, enforced by BFE).
    def _FwpmFilterGetSecurityInfoByKey0(self, engine: int, key: Any, info: int, *outs: Any) -> int:
        f = self.filters.get(_guid(key._obj))
        if f is None:
            return win32wfp.FWP_E_FILTER_NOT_FOUND
        if not self._may(f.sddl, 0x20000):
            return ACCESS_DENIED
        h = self._handle()
        self.bfe_memory[h] = _as_windows_writes(f.sddl or "D:(A;;GA;;;BA)(A;;GA;;;SY)")
        outs[-1]._obj.value = h
        return 0

    def _ConvertSecurityDescriptorToStringSecurityDescriptorW(
        self, sd: Any, rev: int, info: int, out: Any, size: Any
    ) -> int:
        text = self.bfe_memory[int(sd.value)]  # a freed descriptor here would be a use after free
        out._obj.value, size._obj.value = text, len(text) + 1
        return 1

    def _FwpmFilterDeleteByKey0(self, engine: int, key: Any) -> int:
        f = self.filters.get(_guid(key._obj))
        if f is None:
            return win32wfp.FWP_E_FILTER_NOT_FOUND
        if not self._may(f.sddl, 0x10000):  # DELETE
            return ACCESS_DENIED
        del self.filters[f.key]
        return 0

    def _FwpmSubLayerDeleteByKey0(self, engine: int, key: Any) -> int:
        k = _guid(key._obj)
        if k not in self.sublayers:
            return win32wfp.FWP_E_SUBLAYER_NOT_FOUND
        if any(f.sublayer == k for f in self.filters.values()):
            return win32wfp.FWP_E_IN_USE
        self.sublayers.discard(k)
        return 0

    def _FwpmProviderDeleteByKey0(self, engine: int, key: Any) -> int:
        k = _guid(key._obj)
        if k not in self.providers:
            return win32wfp.FWP_E_PROVIDER_NOT_FOUND
        if any(f.provider == k for f in self.filters.values()):
            return win32wfp.FWP_E_IN_USE
        self.providers.discard(k)
        return 0

    def _ConvertStringSecurityDescriptorToSecurityDescriptorW(self, sddl: str, rev: int, out: Any, size: Any) -> int:
        assert rev == 1  # SDDL_REVISION_1
        h = self._handle()
        self.live_sds[h] = sddl
        out._obj.value, size._obj.value = h, 20 + len(sddl)
        return 1

    def _LocalFree(self, mem: Any) -> None:
        self.live_sds.pop(int(mem.value), None)
        return None


#: Which of the conditions sandgate uses each layer offers (session 38): "The Windows Filtering
#: Platform (WFP) filter engine supports a different set of filtering conditions at each of its
#: filtering layers", https://learn.microsoft.com/en-us/windows/win32/fwp/filtering-conditions-available-at-each-filtering-layer
#: (LISTEN: no IP_PROTOCOL, no remote side; RESOURCE_ASSIGNMENT: no remote side).
_ALL = set(wfp.FIELDS.values())
_BY_KIND = {
    "ALE_AUTH_CONNECT": _ALL,
    "ALE_AUTH_RECV_ACCEPT": _ALL,
    "ALE_RESOURCE_ASSIGNMENT": {wfp.FIELDS["user"], wfp.FIELDS["protocol"], wfp.FIELDS["local_port"]},
    "ALE_AUTH_LISTEN": {wfp.FIELDS["user"], wfp.FIELDS["local_port"]},
}
FIELDS_AT: dict[uuid.UUID, set[uuid.UUID]] = {key: _BY_KIND[name[:-3]] for name, key in wfp.LAYERS.items()}


def _valid_filter(f: Any) -> bool:
    """The documented shape of an FWPM_FILTER0: every condition offered at its layer (above), the
    weight FWP_UINT8 0-15 (a weight range index), FWP_UINT64 or FWP_EMPTY
    (https://learn.microsoft.com/en-us/windows/win32/api/fwpmtypes/ns-fwpmtypes-fwpm_filter0)."""
    allowed = FIELDS_AT.get(uuid.UUID(_guid(f.layerKey)), set())
    conds = [f.filterCondition[i] for i in range(int(f.numFilterConditions))]
    if any(uuid.UUID(_guid(c.fieldKey)) not in allowed for c in conds):
        return False
    wtype = int(f.weight.type)
    return wtype in (0, 4) or (wtype == 1 and int(f.weight.u.uint8) <= 15)


def _as_windows_writes(sddl: str) -> str:
    """Masks rendered as SDDL tokens where every bit has one, as the conversion does (0x20080: LORC);
    SIDs with an alias rendered as the alias."""
    tokens = {0x1: "CC", 0x2: "DC", 0x4: "LC", 0x8: "SW", 0x10: "RP", 0x20: "WP", 0x40: "DT", 0x80: "LO"}
    tokens |= {0x100: "CR", 0x10000: "SD", 0x20000: "RC", 0x40000: "WD", 0x80000: "WO"}

    def render(m: re.Match[str]) -> str:
        mask = int(m.group(1), 16)
        bits = [b for b in tokens if mask & b]
        return ";" + "".join(tokens[b] for b in bits) + ";" if sum(bits) == mask else m.group(0)

    # The local built-in Administrator (RID 500) is written as its alias `LA`, as the conversion does
    # for every SID with one (https://learn.microsoft.com/en-us/windows/win32/secauthz/sid-strings);
    # the fake's machine holds only local accounts, so every S-1-5-21-...-500 is that account.
    sddl = re.sub(r";S-1-5-21-\d+-\d+-\d+-500\)", ";LA)", sddl)
    return re.sub(r";(0x[0-9a-fA-F]+);", render, sddl)


def _guid(g: Any) -> str:
    return str(uuid.UUID(bytes_le=bytes(ctypes.string_at(ctypes.addressof(g), 16))))

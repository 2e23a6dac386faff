"""Windows paths in fsguard's POSIX path math: `C:\\Users\\me` <-> `/C:/Users/me`.

Why a mapping and not a second copy of fsguard/policy.py: the protected-path lists and the
`effective()` rules (relative protections inside every writable root, `unprotect` limits) must be
the same on both platforms; fsguard computes them with posixpath, so Windows paths are carried
through it in a form posixpath cannot misread (a drive becomes the first component).
"""

from __future__ import annotations

import ntpath


class WinPathError(ValueError):
    """A path the Windows backend will not plan for (relative to a drive, UNC, device paths)."""


def to_posix(path: str) -> str:
    """`C:\\a\\b` -> `/C:/a/b` (drive letter upper-cased). Only absolute drive paths: a UNC share or
    a `\\\\?\\` device path would let a policy name another machine or bypass Win32 normalisation."""
    if path.startswith(("\\\\", "//")):
        raise WinPathError(f"{path!r}: UNC and device paths are not supported; name a drive path")
    drive, rest = ntpath.splitdrive(path)
    if len(drive) != 2 or drive[1] != ":" or not drive[0].isalpha() or not rest.startswith(("\\", "/")):
        raise WinPathError(f"{path!r}: expected an absolute drive path such as C:\\work")
    parts = [p for p in rest.replace("\\", "/").split("/") if p and p != "."]
    if ".." in parts:
        raise WinPathError(f"{path!r}: '..' is not allowed; write the path it means")
    return "/" + drive[0].upper() + ":" + "".join("/" + p for p in parts)


def to_windows(path: str) -> str:
    """`/C:/a/b` -> `C:\\a\\b`: the inverse of to_posix for paths fsguard computed."""
    if len(path) < 3 or path[0] != "/" or path[2] != ":":
        raise WinPathError(f"{path!r} is not a mapped Windows path")
    rest = path[3:].replace("/", "\\")
    return path[1:3] + (rest or "\\")


def key(path: str) -> str:
    """NTFS names compare case-insensitively (`.GiT` is `.git`): the key plans deduplicate by. By
    upper-casing one character at a time, as the volume's upcase table does (one-to-one mappings
    only), not str.casefold(): `straße` and `strasse` are two objects on NTFS (win-acl A8)."""
    return "".join(up if len(up := ch.upper()) == 1 else ch for ch in path)

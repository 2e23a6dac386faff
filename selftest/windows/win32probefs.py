"""The real file operations behind aclprobes.FsOps: Python's open/os map to CreateFileW,
CreateDirectoryW and MoveFileExW, which take the `name:stream` and `name::$INDEX_ALLOCATION`
spellings the probes try; GetShortPathNameW gives the 8.3 alias. Effects only, no decisions."""

from __future__ import annotations

import ntpath
import os


class OsFsOps:
    """FsOps over the real Win32 calls (Python's own open/os map to CreateFileW/MoveFileExW)."""

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def delete(self, path: str) -> None:
        if os.path.isdir(path):
            os.rmdir(path)
        else:
            os.remove(path)

    def short_alias(self, path: str) -> str | None:
        import ctypes

        buf = ctypes.create_unicode_buffer(32768)
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined,unused-ignore]
        n = kernel32.GetShortPathNameW(path, buf, len(buf))
        if not n or n >= len(buf):  # an error, not "no alias" (that returns the long name)
            raise OSError(ctypes.get_last_error(), "GetShortPathNameW failed", path)  # type: ignore[attr-defined,unused-ignore]
        alias = ntpath.basename(buf.value)
        return None if alias.casefold() == ntpath.basename(path).casefold() else alias

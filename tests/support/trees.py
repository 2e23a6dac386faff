"""One fingerprint of a directory tree: "the real home is byte for byte as it was"."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tree_hash(root: Path) -> str:
    """SHA-256 over every path, file mode and content, and every directory's entries and mode, in order."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for n in sorted(filenames):
            p = Path(dirpath) / n
            h.update(f"{p.relative_to(root)}:{p.stat().st_mode}:".encode() + p.read_bytes())
        h.update(f"{dirpath}:{sorted(dirnames)}:{os.stat(dirpath).st_mode}".encode())
    return h.hexdigest()

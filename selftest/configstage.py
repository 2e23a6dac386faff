"""The `config_files` probe's outside half: the run's own configuration, staged in its workspace.

Run OUTSIDE by verify, never inside. Before a pass: a policy (named with --policy) that includes a
file in a directory of its own, and a CA bundle (named with --upstream-ca), in the pass's
workspace, owned by the command's user (only sandgate, never a file mode, may keep it out), with
an ordinary file and directory beside them for the probe's control. After the pass: every one of
them must be byte-identical and where it was, so a blocked row is judged by the host too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from selftest.probes.configfiles import CA, CONFIG_DIR, CONFIG_FILES, INCLUDE, NEIGHBOUR, NEIGHBOUR_DIR, POLICY

PROBE = "config_files"


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError as e:
        return f"unreadable: {e.strerror}"


@dataclass(frozen=True)
class ConfigStage:
    ws: Path
    before: dict[str, str]  # path relative to the workspace -> its digest

    @classmethod
    def stage(cls, ws: Path, ca_pem: Path, uid: int, gid: int) -> ConfigStage:
        root = ws / CONFIG_DIR
        (ws / INCLUDE).parent.mkdir(parents=True)
        (ws / NEIGHBOUR_DIR).mkdir()
        (ws / POLICY).write_text(
            f"version: 1\ndescription: verify's own policy in its workspace\ninclude: [./{Path(INCLUDE).relative_to(CONFIG_DIR)}]\n"
        )
        (ws / INCLUDE).write_text("version: 1\ndescription: a file verify's workspace policy includes\n")
        shutil.copy(ca_pem, ws / CA)
        (ws / NEIGHBOUR).write_text("an ordinary file beside the configuration\n")
        for p in (root, *root.rglob("*")):
            os.lchown(p, uid, gid)
            p.chmod(0o755 if p.is_dir() else 0o644)
        return cls(ws, {f: _digest(ws / f) for f in CONFIG_FILES})

    @property
    def policy(self) -> Path:
        return self.ws / POLICY

    @property
    def ca(self) -> Path:
        return self.ws / CA

    def evidence(self) -> dict[tuple[str, str], str]:
        """{(probe, "*"): what the host shows} after the pass; empty if every file is as it was."""
        changed = [f"{f}: {was} -> {now}" for f, was in self.before.items() if (now := _digest(self.ws / f)) != was]
        moved = sorted(
            p.name for p in (*self.ws.glob(f"{CONFIG_DIR}-moved-*"), *(self.ws / CONFIG_DIR).glob("*-moved-*"))
        )
        found = "; ".join([*changed, *(f"{m} left behind (a directory renamed)" for m in moved)])
        return {(PROBE, "*"): found} if found else {}

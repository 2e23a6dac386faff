"""The files that configure the run itself, kept in its workspace: its --policy file, a file that
policy includes, its --upstream-ca bundle (issue 24: a run rewrote its own policy, and the user's
next identical command sent the brokered secret to the host the run chose)."""

from __future__ import annotations

import os
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, attempt, combine, probe
from selftest.probes.filesystem import try_append

#: verify stages these in the pass's workspace (selftest/configstage.py) and names the
#: policy with --policy and the bundle with --upstream-ca: paths relative to the workspace.
CONFIG_DIR = "verify-config"
POLICY = f"{CONFIG_DIR}/policy.yaml"
INCLUDE_DIR = f"{CONFIG_DIR}/included"
INCLUDE = f"{INCLUDE_DIR}/extra.yaml"
CA = f"{CONFIG_DIR}/ca.pem"
CONFIG_FILES = (POLICY, INCLUDE, CA)
#: The control: an ordinary file and directory beside them, which the command may change.
NEIGHBOUR = f"{CONFIG_DIR}/notes.txt"
NEIGHBOUR_DIR = f"{CONFIG_DIR}/plain"


def _rename_over(path: str, tag: str) -> Result:
    """Replace `path` by renaming a new file over it (what an editor or `sed -i` does)."""
    new = Path(f"{path}.verify-{tag}")
    new.write_text("version: 1\n")
    try:
        os.rename(new, path)
    finally:
        new.unlink(missing_ok=True)
    return "permitted", f"renamed a new file over {path}"


def _rename_away(path: str, tag: str) -> Result:
    """Rename a directory away (to make a new one in its place); put back if it worked."""
    moved = f"{path}-moved-{tag}"
    os.rename(path, moved)
    os.rename(moved, path)
    return "permitted", f"renamed {path} away (and back)"


def _control(c: Ctx, tag: str) -> Result:
    line = b"# " + c.marker
    try_append(NEIGHBOUR, line, create=False)
    _rename_over(NEIGHBOUR, tag)
    _rename_away(NEIGHBOUR_DIR, tag)
    return "permitted", f"{NEIGHBOUR} written and replaced, {NEIGHBOUR_DIR} renamed"


@probe("filesystem", "config_files", "blocked")
def config_files(c: Ctx) -> Result:
    """Changing what configures the run: its --policy file, an included file and its --upstream-ca, in the workspace: append, rename over, rename their directories."""
    missing = [p for p in (*CONFIG_FILES, NEIGHBOUR, NEIGHBOUR_DIR) if not os.path.lexists(p)]
    if missing:
        raise Unsupported(f"verify staged no {', '.join(missing)} in the workspace here: cannot tell")
    tag = f"{c.context}-{os.getpid()}"
    control = attempt(_control, c, tag)
    if control[0] != "permitted":
        return "unsupported", f"control failed, cannot tell: {control[1]}"
    line = b"# " + c.marker
    parts = [(f"append {p}", attempt(try_append, p, line, create=False)) for p in CONFIG_FILES]
    parts += [(f"rename over {p}", attempt(_rename_over, p, tag)) for p in CONFIG_FILES]
    parts += [(f"rename {d}", attempt(_rename_away, d, tag)) for d in (INCLUDE_DIR, CONFIG_DIR)]
    return combine(parts, need="any")

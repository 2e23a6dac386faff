"""The filesystem probes: writes outside the workspace, protected paths created or renamed, links out
of the workspace, and the run's own audit log forged or erased."""

from __future__ import annotations

import json
import os
from pathlib import Path

from selftest.probes.core import Ctx, Result, Unsupported, attempt, combine, describe, is_refusal, probe

AUDIT_NAME = "audit-verify.jsonl"  # inside the workspace (not under the protected .sandgate/)


# --------------------------------------------------------------------------- helpers


def unique_tag(c: Ctx) -> str:
    return f"{c.context}-{os.getpid()}"


def try_append(path: str | Path, data: bytes, *, create: bool) -> Result:
    """Append `data` (never truncate); permitted once it is written."""
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        n = os.write(fd, data)
    finally:
        os.close(fd)
    return "permitted", f"wrote {n} bytes to {path}"


def _roundtrip(directory: Path, stem: str) -> Result:
    """Create, write, rename, read back and delete a file in `directory`."""
    a, b = directory / f"{stem}.tmp", directory / f"{stem}.renamed"
    payload = b"sandgate verify\n"
    try:
        a.write_bytes(payload)
        os.rename(a, b)
        if b.read_bytes() != payload:
            raise Unsupported(f"{b} read back different content")
        b.unlink()
    finally:
        for p in (a, b):
            p.unlink(missing_ok=True)
    return "permitted", f"create/write/rename/delete in {directory}"


def git_dir() -> Path:
    git = Path(".git")
    if not git.is_dir():
        raise Unsupported("no .git directory in the workspace")
    return git


def write_into(path: Path, data: bytes) -> Result:
    """Create or append to `path` (its directories too); a placeholder directory in its way is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return try_append(path, data, create=True)
    except IsADirectoryError:
        os.rmdir(path)  # sandgate's read-only placeholder for a missing file: a mount point, EBUSY
        return try_append(path, data, create=True)


# --------------------------------------------------------------------------- probes


@probe("filesystem", "write_workspace", "permitted")
def write_workspace(c: Ctx) -> Result:
    """Control: the command can work in its workspace (cwd) and its private /tmp."""
    stem = f".sandgate-verify-{unique_tag(c)}"
    return combine(
        [
            ("workspace", attempt(_roundtrip, Path.cwd(), stem)),
            ("/tmp", attempt(_roundtrip, Path("/tmp"), stem.lstrip("."))),
        ],
        need="all",
    )


@probe("filesystem", "write_outside", "blocked")
def write_outside(c: Ctx) -> Result:
    """Writes outside the workspace: tampering with other projects, dotfiles, persistence.

    ~/.bashrc is written too, but inside ~ is the sandbox's own overlay: that write may succeed
    there, and verify judges it by the REAL file on the host afterwards (it must be unchanged)."""
    line = b"# " + c.marker
    try:
        with open(Path(c.spec.home) / ".bashrc", "ab") as f:
            f.write(line + b"\n")
    except OSError:
        pass  # refused outright is fine too
    return combine(
        [
            ("outside_file", attempt(try_append, c.spec.outside_file, line, create=False)),
            (
                "outside_dir",
                attempt(try_append, Path(c.spec.outside_dir) / f"verify-{c.context}.txt", line, create=True),
            ),
        ],
        need="any",
    )


def _create_or_open(path: Path) -> Result:
    """Create `path` (removed again afterwards) or, if it exists, open it for writing without writing.

    A directory there is sandgate's placeholder for a missing file: the name is only safe if the
    directory can neither be removed nor filled (removing it would free the name for a file)."""
    if path.is_dir() and not path.is_symlink():
        try:
            os.rmdir(path)
        except OSError as e:
            if not is_refusal(e):
                raise
        else:
            path.mkdir()
            return "permitted", f"removed the placeholder {path} (made again)"
        inner = path / ".sandgate-probe"
        fd = os.open(inner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # a refusal raises: blocked
        os.close(fd)
        inner.unlink()
        return "permitted", f"created {inner} inside the placeholder (removed again)"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.close(fd)
        return "permitted", f"existing {path} opened for writing"
    os.close(fd)
    path.unlink()
    return "permitted", f"created {path} (removed again)"


def _mkdir_control(c: Ctx) -> Result:
    d = Path(f".sandgate-probe-{c.context}")
    d.mkdir()
    d.rmdir()
    return "permitted", f"mkdir/rmdir {d} works"


@probe("filesystem", "create_protected", "blocked")
def create_protected(c: Ctx) -> Result:
    """Creating a missing protected path (.sandgate.yaml policy, .sandgate/) the user would later trust."""
    control = attempt(_mkdir_control, c)
    if control[0] != "permitted":
        return "unsupported", f"control failed, cannot tell: {control[1]}"
    parts = [(".sandgate.yaml", attempt(_create_or_open, Path(".sandgate.yaml")))]
    if Path(".sandgate").is_dir():
        parts.append((".sandgate/", attempt(_create_or_open, Path(".sandgate") / f"verify-{unique_tag(c)}")))
    return combine(parts, need="any")


@probe("filesystem", "symlink_escape", "blocked")
def symlink_escape(c: Ctx) -> Result:
    """A symlink in the workspace pointing outside: writing through it must not reach the target."""
    link = Path(f"sl-{unique_tag(c)}")
    link.unlink(missing_ok=True)
    try:
        os.symlink(c.spec.outside_file, link)
    except OSError as e:
        raise Unsupported(f"cannot create a symlink in the workspace: {describe(e)}") from e
    try:
        return try_append(link, b"# " + c.marker, create=False)
    finally:
        link.unlink(missing_ok=True)


@probe("filesystem", "hardlink_escape", "blocked")
def hardlink_escape(c: Ctx) -> Result:
    """A hard link into the workspace makes an outside file writable under an allowed path."""
    link = Path(f"hl-{unique_tag(c)}")
    link.unlink(missing_ok=True)
    os.link(c.spec.outside_file, link)
    link.unlink()
    return "permitted", f"linked {c.spec.outside_file} as {link} (removed again)"


def _truncate(path: str) -> Result:
    os.truncate(path, 0)
    return "permitted", f"truncated {path}"


def _rename(path: str, mark: str) -> Result:
    os.rename(path, f"{path}.moved-{mark}")  # left moved: verify sees the log gone
    return "permitted", f"renamed {path} away"


def _remove(path: str) -> Result:
    os.unlink(path)
    return "permitted", f"removed {path}"


@probe("filesystem", "audit_log_forge", "blocked")
def audit_log_forge(c: Ctx) -> Result:
    """Forging or erasing the run's own audit log, here kept inside the workspace: append, truncate, rename, remove."""
    log = c.spec.audit_log
    if not os.path.isfile(log):
        raise Unsupported(f"the audit log {log} is not visible here: cannot tell")
    forged = json.dumps({"event": "decision", "verdict": "allow", "forged": c.marker.decode().strip()}) + "\n"
    return combine(
        [
            ("append", attempt(try_append, log, forged.encode(), create=False)),
            ("truncate", attempt(_truncate, log)),
            ("rename", attempt(_rename, log, c.mark)),
            ("remove", attempt(_remove, log)),
        ],
        need="any",
    )

"""The allowlists shipped with sandgate (allowlists/*.yaml): `include: [pypi]`, `--allow pypi`."""

from __future__ import annotations

from pathlib import Path

from launcher.config import yamlfile

ALLOWLIST_DIR = Path(__file__).resolve().parent.parent.parent / "allowlists"


def bundled_names() -> list[str]:
    return sorted(p.stem for p in ALLOWLIST_DIR.glob("*.yaml"))


def bundled_path(name: str) -> Path | None:
    p = ALLOWLIST_DIR / f"{name}.yaml"
    return p if name in bundled_names() else None


def display(path: Path) -> str:
    """How a file is named in errors and rule origins: bundled lists by their repo path, others as given."""
    try:
        return f"allowlists/{path.resolve().relative_to(ALLOWLIST_DIR)}"
    except ValueError:
        return str(path)


def describe_bundled() -> list[tuple[str, str, int]]:
    """(name, description, number of allow entries) for `sandgate allowlists`."""
    out = []
    for name in bundled_names():
        where = f"allowlists/{name}.yaml"
        doc = yamlfile.policy_document(yamlfile.read(ALLOWLIST_DIR / f"{name}.yaml", where), where)
        out.append((name, str(doc.get("description", "")), len((doc.get("network") or {}).get("allow") or [])))
    return out

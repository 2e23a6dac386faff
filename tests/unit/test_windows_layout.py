"""Issue 29: the Windows modules live beside their Linux counterparts, with the arrows of the shared layout.

sgbase/ imports nothing of ours; netguard/windows and fsguard/windows import only their own guard and sgbase
(never launcher, selftest or the other guard); launcher never imports selftest (the CLI's verify dispatch
aside); and no import circle runs through a Windows module, counting imports inside functions (a lazy
import must not hide one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("sgbase", "netguard", "fsguard", "launcher", "selftest")
#: The one launcher module that may name selftest: `sandgate verify`'s dispatch.
VERIFY_DISPATCH = {"launcher.cliparsers", "launcher.cli"}


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for top in TOPS:
        for p in (root / top).rglob("*.py"):
            name = ".".join(p.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _imports(root: Path) -> dict[str, set[str]]:
    """Every module's imports of ours, resolved to modules (top level and inside functions alike)."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        return next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in mods), None)

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]  # a name or a submodule: the longest match
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {m for m in map(resolve, names) if m and m != name}
        graph[name] = found
    return graph


def _windows(name: str) -> bool:
    return name.startswith("sgbase") or ".windows" in name or name == "launcher.run.windowsbackend"


def wrong_arrows(root: Path) -> list[str]:
    bad = []
    for a, targets in _imports(root).items():
        for b in sorted(targets):
            ta, tb = a.split(".")[0], b.split(".")[0]
            if ta == "sgbase" and tb != "sgbase":
                bad.append(f"{a} -> {b}")
            if _windows(a) and ta in ("netguard", "fsguard") and tb not in (ta, "sgbase"):
                bad.append(f"{a} -> {b}")
            if _windows(b) and ta == "launcher" and tb == "selftest" and a not in VERIFY_DISPATCH:
                bad.append(f"{a} -> {b}")
    return bad


def windows_circles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module that hold a Windows module."""
    graph = _imports(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 and any(map(_windows, comp)):
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_windows_arrows_point_down() -> None:
    assert (ROOT / "sgbase" / "windows" / "win32.py").is_file() and not (ROOT / "launcher" / "platform").exists()
    assert wrong_arrows(ROOT) == []


def test_no_import_circle_runs_through_a_windows_module() -> None:
    assert windows_circles(ROOT) == []


def test_the_checks_catch_an_offender(tmp_path: Path) -> None:
    for d in ("sgbase/windows", "netguard/windows", "fsguard/windows", "launcher", "selftest/windows"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "sgbase/windows/api.py").write_text("from netguard.windows import wfp\n")
    (tmp_path / "netguard/windows/wfp.py").write_text("def f():\n    from fsguard.windows import acl\n")
    (tmp_path / "fsguard/windows/acl.py").write_text("import netguard.windows.wfp\n")
    (tmp_path / "launcher/run.py").write_text("from selftest.windows import probe\n")
    (tmp_path / "selftest/windows/probe.py").write_text("")
    assert sorted(wrong_arrows(tmp_path)) == sorted(
        [
            "sgbase.windows.api -> netguard.windows.wfp",
            "netguard.windows.wfp -> fsguard.windows.acl",
            "fsguard.windows.acl -> netguard.windows.wfp",
            "launcher.run -> selftest.windows.probe",
        ]
    )
    assert windows_circles(tmp_path) == [["fsguard.windows.acl", "netguard.windows.wfp"]]

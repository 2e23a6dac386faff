"""Issue 29's acceptance rule, the import graph, drawn from the sources themselves (AST, no import run).

The layers: sgbase at the bottom (imports nothing of ours); the guards (netguard, fsguard) on it, never
importing each other, the launcher or the self-test; the launcher above them; the self-test (selftest/,
the proof) on top, reached by the product only through `sandgate verify` (launcher/cli.py's cmd_verify).
An upward arrow lets a change in the launcher or the self-test alter what a guard enforces; a circle
makes the import order decide which half of a module exists. Every import counts, in functions too,
save those under `if TYPE_CHECKING:` (never run). Cycles are of module-level imports (what runs at
import time), plus one package-level rule: no two of launcher's subpackages import each other. In the
self-test no circle at all, not even one hidden in a function or under TYPE_CHECKING (issue 29 broke two:
a shared piece goes to a module of its own).
An edge goes to the module named (`from a.b import c` to a.b.c when that is a module, else a.b),
not to the packages above it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: The packages of the graph (a missing one, e.g. sgbase before it exists, is simply empty).
PACKAGES = ("launcher", "netguard", "fsguard", "sgbase", "selftest")
GUARDS = ("netguard", "fsguard")
#: The one import of the self-test the product may make: launcher/cli.py's `sandgate verify`.
VERIFY_PATH = ("launcher.cli", "cmd_verify")


@dataclass(frozen=True)
class Edge:
    """One import: `src` (a module of ours) imports `dst` at `path`:`line`, inside function `scope` ('' at module
    level; class bodies and top-level if/try run at import too, so they are module level)."""

    src: str
    dst: str
    path: str
    line: int
    scope: str

    @property
    def module_level(self) -> bool:
        return self.scope == ""

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.src} imports {self.dst}" + (f" (in {self.scope})" if self.scope else "")


def top(name: str) -> str:
    return name.split(".")[0]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _raw_imports(
    tree: ast.AST, scope: str = "", typing: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str, bool]]:
    """Every import statement with its enclosing function ('' at module level) and whether it is under
    `if TYPE_CHECKING:` (its `else:` does run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, scope, typing
        elif isinstance(node, ast.If) and _type_checking(node):
            yield from _raw_imports(ast.Module(body=node.body, type_ignores=[]), scope, True)
            yield from _raw_imports(ast.Module(body=node.orelse, type_ignores=[]), scope, typing)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _raw_imports(node, f"{scope}.{node.name}" if scope else node.name, typing)
        else:
            yield from _raw_imports(node, scope, typing)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules one statement imports: `from a.b import c` is a.b.c when that is a module, else a.b."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level-1 more
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def edges_of(sources: dict[str, tuple[str, str]], typing: bool = False) -> list[Edge]:
    """The edges among `sources` ({module: (path, text)}) to modules of ours (PACKAGES); with `typing`, also
    the imports under `if TYPE_CHECKING:`."""
    known = set(sources)
    out = []
    for module, (path, text) in sorted(sources.items()):
        is_package = path.endswith("__init__.py")
        for node, scope, typing_only in _raw_imports(ast.parse(text, path)):
            if typing_only and not typing:
                continue
            for dst in dict.fromkeys(_targets(node, module, is_package, known)):
                if top(dst) in PACKAGES and dst != module:
                    out.append(Edge(module, dst, path, node.lineno, scope))
    return out


def read_sources(root: Path) -> dict[str, tuple[str, str]]:
    return {
        _module_name(root, p): (str(p.relative_to(root)), p.read_text())
        for package in PACKAGES
        if (root / package).is_dir()
        for p in sorted((root / package).rglob("*.py"))
    }


# ---- the rules: each returns the offending edges (or cycles) as lines naming file:line ----------------------


def guard_violations(edges: Iterable[Edge]) -> list[str]:
    """The guards import only themselves, sgbase and third-party code: never launcher, selftest or each other."""
    return [
        e.where()
        for e in edges
        if top(e.src) in GUARDS and top(e.dst) != top(e.src) and top(e.dst) in ("launcher", "selftest", *GUARDS)
    ]


def sgbase_violations(edges: Iterable[Edge]) -> list[str]:
    """sgbase is below both guards: it imports nothing of ours (but itself)."""
    return [e.where() for e in edges if top(e.src) == "sgbase" and top(e.dst) != "sgbase"]


def selftest_importers(edges: Iterable[Edge]) -> list[str]:
    """Nothing of the product imports the self-test, save `sandgate verify` (tests and bench are not scanned)."""
    return [
        e.where()
        for e in edges
        if top(e.dst) == "selftest" and top(e.src) != "selftest" and (e.src, e.scope) != VERIFY_PATH
    ]


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: no recursion limit on a long chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def _cycles(edges: list[Edge], node_of: dict[str, str]) -> list[str]:
    """Every strongly connected component of more than one node, with the edges inside it."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(node_of[e.src], set()).add(node_of[e.dst])
    found = []
    for comp in _components(graph):
        if len(comp) > 1:
            inside = [e.where() for e in edges if node_of[e.src] in comp and node_of[e.dst] in comp]
            found.append(" <-> ".join(comp) + ":\n    " + "\n    ".join(inside))
    return found


def module_cycles(edges: Iterable[Edge]) -> list[str]:
    """Circles of module-level imports, anywhere in our packages."""
    level = [e for e in edges if e.module_level and e.src != e.dst]
    return _cycles(level, {n: n for e in level for n in (e.src, e.dst)})


def hidden_cycles(edges: Iterable[Edge], package: str) -> list[str]:
    """Circles inside `package` counting every import: in functions and under TYPE_CHECKING too (the
    dependency is there, only its import was moved out of sight)."""
    inside = [e for e in edges if top(e.src) == package and top(e.dst) == package and e.src != e.dst]
    return _cycles(inside, {n: n for e in inside for n in (e.src, e.dst)})


def _subpackage(module: str, packages: set[str]) -> str | None:
    """launcher.X for a module in launcher's subpackage X (its top-level modules belong to none)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if top(module) == "launcher" and ".".join(parts[:2]) in packages else None


def launcher_package_cycles(edges: Iterable[Edge], packages: set[str]) -> list[str]:
    """Two-way arrows between launcher's subpackages (e.g. run <-> platform), imports in functions too."""
    node_of = {}
    between = []
    for e in edges:
        a, b = _subpackage(e.src, packages), _subpackage(e.dst, packages)
        if a is not None and b is not None and a != b:
            node_of.update({e.src: a, e.dst: b})
            between.append(e)
    return _cycles(between, node_of)


def _packages(sources: dict[str, tuple[str, str]]) -> set[str]:
    return {m for m, (path, _) in sources.items() if path.endswith("__init__.py")}


# ---- the real tree ----------------------------------------------------------------------------------------

_SOURCES = read_sources(ROOT)
_EDGES = edges_of(_SOURCES)
_TYPING_EDGES = edges_of(_SOURCES, typing=True)


def test_the_graph_is_read() -> None:
    # Control: the scan sees the arrows everyone knows are there.
    pairs = {(e.src, e.dst) for e in _EDGES}
    assert ("launcher.run.launch", "launcher.run.linuxbackend") in pairs
    assert any(top(s) == "launcher" and top(d) == "netguard" for s, d in pairs)
    assert (*VERIFY_PATH[:1], "selftest.command") in pairs


def test_the_guards_import_no_launcher_selftest_or_each_other() -> None:
    bad = guard_violations(_EDGES)
    assert not bad, "a guard imports above itself or the other guard:\n" + "\n".join(bad)


def test_sgbase_imports_nothing_of_ours() -> None:
    bad = sgbase_violations(_EDGES)
    assert not bad, "sgbase must stay below both guards:\n" + "\n".join(bad)


def test_only_verify_imports_the_selftest() -> None:
    bad = selftest_importers(_EDGES)
    assert not bad, "the product imports the self-test outside launcher/cli.py's cmd_verify:\n" + "\n".join(bad)


def test_no_module_level_import_cycle() -> None:
    found = module_cycles(_EDGES)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_cycle_in_the_selftest_not_even_a_hidden_one() -> None:
    found = hidden_cycles(_TYPING_EDGES, "selftest")
    assert not found, "circles in selftest/ (move the shared piece to a module of its own):\n" + "\n".join(found)


def test_no_cycle_between_launchers_subpackages() -> None:
    found = launcher_package_cycles(_EDGES, _packages(_SOURCES))
    assert not found, "launcher's subpackages import each other:\n" + "\n".join(found)


# ---- every rule can fail: a tiny synthetic tree -------------------------------------------------------------

_SYNTHETIC = {
    "netguard/__init__.py": "",
    "netguard/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import launcher.x\n"
    "def f():\n    from launcher import cli\n    import fsguard.b\n",
    "fsguard/__init__.py": "",
    "fsguard/b.py": "import sgbase.e\nfrom selftest import verify\n",
    "sgbase/__init__.py": "",
    "sgbase/e.py": "import netguard.a\n",
    "launcher/__init__.py": "",
    "launcher/cli.py": "def cmd_verify():\n    from selftest import command\ndef other():\n    import selftest.verify\n",
    "launcher/run/__init__.py": "",
    "launcher/run/m.py": "from launcher.platform import n\nfrom . import o\n",
    "launcher/run/o.py": "import launcher.run.m\n",
    "launcher/platform/__init__.py": "",
    "launcher/platform/n.py": "def f():\n    from ..run import o\n",
    "selftest/__init__.py": "",
    "selftest/command.py": "import launcher.cli\n",
    "selftest/verify.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from selftest.world import W\n",
    "selftest/world.py": "def f():\n    import selftest.verify\n",
}


def _synthetic(tmp_path: Path) -> tuple[list[Edge], set[str]]:
    for name, text in _SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    sources = read_sources(tmp_path)
    return edges_of(sources), _packages(sources)


def test_every_rule_catches_an_offender(tmp_path: Path) -> None:
    edges, packages = _synthetic(tmp_path)
    assert guard_violations(edges) == [
        "fsguard/b.py:2: fsguard.b imports selftest.verify",
        "netguard/a.py:5: netguard.a imports launcher.cli (in f)",  # in a function too; not the TYPE_CHECKING one
        "netguard/a.py:6: netguard.a imports fsguard.b (in f)",
    ]
    assert sgbase_violations(edges) == ["sgbase/e.py:1: sgbase.e imports netguard.a"]
    assert selftest_importers(edges) == [
        "fsguard/b.py:2: fsguard.b imports selftest.verify",
        "launcher/cli.py:4: launcher.cli imports selftest.verify (in other)",  # cmd_verify's import is the one allowed
    ]
    assert module_cycles(edges) == [
        "launcher.run.m <-> launcher.run.o:\n"
        "    launcher/run/m.py:2: launcher.run.m imports launcher.run.o\n"
        "    launcher/run/o.py:1: launcher.run.o imports launcher.run.m"
    ]
    assert launcher_package_cycles(edges, packages) == [
        "launcher.platform <-> launcher.run:\n"
        "    launcher/platform/n.py:2: launcher.platform.n imports launcher.run.o (in f)\n"
        "    launcher/run/m.py:1: launcher.run.m imports launcher.platform.n"
    ]
    assert hidden_cycles(edges, "selftest") == []  # without the TYPE_CHECKING import, no circle
    assert hidden_cycles(edges_of(read_sources(tmp_path), typing=True), "selftest") == [
        "selftest.verify <-> selftest.world:\n"
        "    selftest/verify.py:3: selftest.verify imports selftest.world\n"
        "    selftest/world.py:2: selftest.world imports selftest.verify (in f)"
    ]


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    # The other half of the control: the rules do not fire on a tree that keeps them.
    for name, text in {
        "sgbase/__init__.py": "",
        "sgbase/e.py": "import os\n",
        "netguard/a.py": "import sgbase.e\n",
        "launcher/cli.py": "import netguard.a\ndef cmd_verify():\n    from selftest import command\n",
        "selftest/command.py": "from launcher import cli\ndef f():\n    import selftest.command\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    sources = read_sources(tmp_path)
    edges = edges_of(sources)
    assert len(edges) == 4  # sgbase/e.py imports only os; selftest.command's self-import is no edge
    assert not guard_violations(edges) and not sgbase_violations(edges) and not selftest_importers(edges)
    assert not module_cycles(edges) and not launcher_package_cycles(edges, _packages(sources))
    assert not hidden_cycles(edges_of(sources, typing=True), "selftest")

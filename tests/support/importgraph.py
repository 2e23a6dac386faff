"""The one reader of the import graph, for every test that holds the code to its arrows (AST: nothing is run).

Every import statement of every .py under the packages read, with its file:line, the function it sits in
('' at module level: class bodies and top-level if/try run at import too) and whether it is under
`if TYPE_CHECKING:` (never run; its `else:` does run). Relative imports are resolved; an import goes to
the module it names (`from a.b import c` to a.b.c when that is a module of the tree, else a.b), not to
the packages above it. Imports of stdlib and third-party modules are kept too (a rule may forbid one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

#: The packages of the product's graph (a missing one is simply empty).
PACKAGES = ("launcher", "netguard", "fsguard", "sgbase", "selftest")


def top(name: str) -> str:
    return name.split(".")[0]


@dataclass(frozen=True)
class Import:
    """One import: module `src` (at `path`:`line`, inside function `scope`) imports module `dst`."""

    src: str
    dst: str
    path: str
    line: int
    scope: str
    typing: bool

    @property
    def module_level(self) -> bool:
        """Run at import time: neither in a function nor under TYPE_CHECKING."""
        return self.scope == "" and not self.typing

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.src} imports {self.dst}" + (f" (in {self.scope})" if self.scope else "")


@dataclass(frozen=True)
class Tree:
    """The modules read ({name: path relative to the root}) and all their imports."""

    modules: dict[str, str]
    imports: tuple[Import, ...]

    @cached_property
    def packages(self) -> frozenset[str]:
        return frozenset(m for m, path in self.modules.items() if path.endswith("__init__.py"))

    def edges(self, tops: tuple[str, ...] = PACKAGES) -> list[Import]:
        """The imports between modules of `tops` (a module's import of itself is no edge)."""
        return [i for i in self.imports if top(i.dst) in tops and top(i.src) in tops and i.dst != i.src]

    def of(self, module: str) -> list[Import]:
        return [i for i in self.imports if i.src == module]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _statements(
    tree: ast.AST, scope: str = "", typing: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str, bool]]:
    """Every import statement, at any depth, with its enclosing function and its TYPE_CHECKING flag."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, scope, typing
        elif isinstance(node, ast.If) and _type_checking(node):
            yield from _statements(ast.Module(body=node.body, type_ignores=[]), scope, True)
            yield from _statements(ast.Module(body=node.orelse, type_ignores=[]), scope, typing)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _statements(node, f"{scope}.{node.name}" if scope else node.name, typing)
        else:
            yield from _statements(node, scope, typing)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules one statement imports, relative ones resolved from the importing module's package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level-1 more
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return list(dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names))


def imports_of(module: str, path: str, text: str, known: set[str]) -> list[Import]:
    """The imports of one module's source `text`; `known` is every module of the tree (for `from a import b`)."""
    is_package = path.endswith("__init__.py")
    return [
        Import(module, dst, path, node.lineno, scope, typing)
        for node, scope, typing in _statements(ast.parse(text, path))
        for dst in _targets(node, module, is_package, known)
    ]


def read(root: Path, tops: tuple[str, ...] = PACKAGES) -> Tree:
    """Every module under `root`/<top> for each of `tops`, and its imports."""
    files = {module_name(root, p): p for t in tops if (root / t).is_dir() for p in sorted((root / t).rglob("*.py"))}
    modules = {m: str(p.relative_to(root)) for m, p in files.items()}
    known = set(files)
    found = [i for m, p in sorted(files.items()) for i in imports_of(m, modules[m], p.read_text(), known)]
    return Tree(modules, tuple(found))

"""Every rule of the import graph (issue 29), drawn from the sources by the one reader (tests/support/importgraph.py).

The layers: sgbase at the bottom (imports nothing of ours); the guards (netguard, fsguard) on it, never
importing each other, the launcher or the self-test; the launcher above them; the self-test (selftest/,
the proof) on top, reached by the product only through `sandgate verify` (launcher/cli.py's cmd_verify).
An upward arrow lets a change in the launcher or the self-test alter what a guard enforces; a circle
makes the import order decide which half of a module exists.
Which imports count, rule by rule (the strictest each rule had when it lived in a module of its own):
- the arrows between packages, the network guard's roles, launcher.config's readers, the tests'
  directories: every import, in functions and under `if TYPE_CHECKING:` too (a lazy or type-only import
  is still a dependency on the other side);
- circles: of module-level imports anywhere (what runs at import time); between launcher's subpackages
  counting function-level imports; none at all, counting every import, inside the self-test or through
  a Windows module (a shared piece goes to a module of its own, not behind a lazy import).
Each rule has a synthetic offender below: a check that never fires could be measuring nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..support.importgraph import Import, Tree, read, top

ROOT = Path(__file__).resolve().parent.parent.parent
GUARDS = ("netguard", "fsguard")
#: The one import of the self-test the product may make: launcher/cli.py's `sandgate verify`.
VERIFY_PATH = ("launcher.cli", "cmd_verify")
#: The network guard's three roles: the daemon asks the decision, the relay moves bytes. A relay that
#: imported the decision could be made to decide; a decision that imported the daemon closes a circle.
ROLES = ("daemon", "decision", "relay")
#: What each place may not import ("netguard" is the top level's own modules: spec, policy, audit, ...).
ROLE_FORBIDDEN = {
    "daemon": (),
    "decision": ("netguard.daemon",),
    "relay": ("netguard.daemon", "netguard.decision"),
    "netguard": tuple(f"netguard.{r}" for r in ROLES),
}
#: launcher.config one way: reading a hostile file depends on nothing of ours; the readers use it and never
#: the trust list; the trust list and narrowing never import a reader back (no detour through trust).
_READERS = ("launcher.config.load", "launcher.config.yamlfile")
_STORE = ("launcher.config.trust", "launcher.config.narrowing")
CONFIG_FORBIDDEN = {
    "launcher.config.hostilefile": ("launcher", "netguard", "fsguard", "sgbase", "selftest"),
    "launcher.config.trust": _READERS,
    "launcher.config.narrowing": _READERS,
    "launcher.config.yamlfile": _STORE,
    "launcher.config.hostsfiles": _STORE,
    "launcher.config.parsecache": _STORE,
}
#: The tests' two directories run in separate pytest invocations (tests/__main__.py): what both use
#: lives in tests.support, never in a test module of the other.
TEST_DIRS = ("tests.unit", "tests.e2e")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# ---- the arrows: each returns the offending imports as lines naming file:line -----------------------------


def guard_violations(edges: Iterable[Import]) -> list[str]:
    """The guards import only themselves, sgbase and third-party code: never launcher, selftest or each other."""
    return [
        e.where()
        for e in edges
        if top(e.src) in GUARDS and top(e.dst) != top(e.src) and top(e.dst) in ("launcher", "selftest", *GUARDS)
    ]


def sgbase_violations(edges: Iterable[Import]) -> list[str]:
    """sgbase is below both guards: it imports nothing of ours (but itself)."""
    return [e.where() for e in edges if top(e.src) == "sgbase" and top(e.dst) != "sgbase"]


def selftest_importers(edges: Iterable[Import]) -> list[str]:
    """Nothing of the product imports the self-test, save `sandgate verify` (tests and bench are not scanned)."""
    return [
        e.where()
        for e in edges
        if top(e.dst) == "selftest" and top(e.src) != "selftest" and (e.src, e.scope) != VERIFY_PATH
    ]


def _role(module: str, packages: frozenset[str]) -> str | None:
    """The place of a netguard module: its role's package (any depth), or "netguard" for the top level's own."""
    parts = module.split(".")
    if parts[0] != "netguard":
        return None
    if len(parts) > 1 and parts[1] in ROLES:
        return parts[1]
    return "netguard" if len(parts) == 1 or (len(parts) == 2 and module not in packages) else None


def role_violations(edges: Iterable[Import], packages: frozenset[str]) -> list[str]:
    """daemon -> decision -> relay -> netguard's top level, one way."""
    out = []
    for e in edges:
        place = _role(e.src, packages)
        if place is not None and any(_under(e.dst, bad) for bad in ROLE_FORBIDDEN[place]):
            out.append(e.where())
    return out


def config_violations(edges: Iterable[Import]) -> list[str]:
    """launcher.config's readers, hostile-file reading and the trust list import one way (CONFIG_FORBIDDEN)."""
    return [e.where() for e in edges if e.dst.startswith(CONFIG_FORBIDDEN.get(e.src, ()))]


def crossed_test_dirs(edges: Iterable[Import]) -> list[str]:
    """A test module of tests/unit importing one of tests/e2e, or the other way."""
    out = []
    for e in edges:
        a = next((d for d in TEST_DIRS if _under(e.src, d)), None)
        b = next((d for d in TEST_DIRS if _under(e.dst, d)), None)
        if a is not None and b is not None and a != b:
            out.append(e.where())
    return out


# ---- the circles -------------------------------------------------------------------------------------------


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


def _cycles(
    edges: list[Import], node_of: Callable[[str], str] = str, keep: Callable[[list[str]], bool] = bool
) -> list[str]:
    """Every strongly connected component of more than one node (that `keep` keeps), with the edges inside."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(node_of(e.src), set()).add(node_of(e.dst))
    found = []
    for comp in _components(graph):
        if len(comp) > 1 and keep(comp):
            inside = [e.where() for e in edges if node_of(e.src) in comp and node_of(e.dst) in comp]
            found.append(" <-> ".join(comp) + ":\n    " + "\n    ".join(inside))
    return found


def module_cycles(edges: Iterable[Import]) -> list[str]:
    """Circles of module-level imports, anywhere in our packages."""
    return _cycles([e for e in edges if e.module_level])


def hidden_cycles(edges: Iterable[Import], package: str) -> list[str]:
    """Circles inside `package` counting every import: in functions and under TYPE_CHECKING too (the
    dependency is there, only its import was moved out of sight)."""
    return _cycles([e for e in edges if top(e.src) == package and top(e.dst) == package])


def _windows(module: str) -> bool:
    """sgbase (its windows/ bindings), a windows package of a guard or the launch, the Windows backend."""
    return top(module) == "sgbase" or ".windows" in module


def windows_cycles(edges: Iterable[Import]) -> list[str]:
    """Circles through a Windows module, counting every import (a lazy import must not hide one)."""
    return _cycles(list(edges), keep=lambda comp: any(map(_windows, comp)))


def launcher_package_cycles(edges: Iterable[Import], packages: frozenset[str]) -> list[str]:
    """Two-way arrows between launcher's subpackages (e.g. run <-> platform), imports in functions too."""

    def subpackage(module: str) -> str | None:  # launcher.X for a module of subpackage X (its top level: none)
        head = ".".join(module.split(".")[:2])
        return head if top(module) == "launcher" and head in packages else None

    between = []
    for e in edges:
        a, b = subpackage(e.src), subpackage(e.dst)
        if not e.typing and a is not None and b is not None and a != b:
            between.append(e)
    return _cycles(between, lambda m: subpackage(m) or m)


# ---- the real tree ----------------------------------------------------------------------------------------

_TREE = read(ROOT)
_EDGES = _TREE.edges()


def test_the_graph_is_read() -> None:
    # Control: the scan sees the arrows everyone knows are there, in every form the reader knows.
    pairs = {(e.src, e.dst) for e in _EDGES}
    assert ("launcher.run.launch", "launcher.run.linuxbackend") in pairs
    assert any(top(s) == "launcher" and top(d) == "netguard" for s, d in pairs)
    assert (VERIFY_PATH[0], "selftest.command") in pairs
    assert ("launcher.config.yamlfile", "launcher.config.hostilefile") in pairs
    assert any(e.scope for e in _EDGES) and any(e.typing for e in _EDGES)
    assert len({top(e.src) for e in _EDGES}) == 5  # every package was read


def test_the_guards_import_no_launcher_selftest_or_each_other() -> None:
    bad = guard_violations(_EDGES)
    assert not bad, "a guard imports above itself or the other guard:\n" + "\n".join(bad)


def test_sgbase_imports_nothing_of_ours() -> None:
    bad = sgbase_violations(_EDGES)
    assert not bad, "sgbase must stay below both guards:\n" + "\n".join(bad)


def test_only_verify_imports_the_selftest() -> None:
    bad = selftest_importers(_EDGES)
    assert not bad, "the product imports the self-test outside launcher/cli.py's cmd_verify:\n" + "\n".join(bad)


def test_the_network_guards_roles_import_one_way() -> None:
    bad = role_violations(_EDGES, _TREE.packages)
    assert not bad, "imports against the roles (daemon -> decision -> relay):\n" + "\n".join(bad)


def test_every_role_is_a_package_and_the_old_one_is_gone() -> None:
    for role in ROLES:
        assert f"netguard.{role}" in _TREE.packages
        assert sum(_role(m, _TREE.packages) == role for m in _TREE.modules) > 5  # not an empty shell
    assert not any(_under(m, "netguard.proxy") for m in _TREE.modules)  # split, not copied


def test_reading_a_policy_never_detours_through_the_trust_list() -> None:
    bad = config_violations(_EDGES)
    assert not bad, "launcher.config's arrows:\n" + "\n".join(bad)


def test_the_windows_modules_live_beside_their_linux_counterparts() -> None:
    assert "sgbase.windows.win32" in _TREE.modules and not any(_under(m, "launcher.platform") for m in _TREE.modules)


def test_no_module_level_import_cycle() -> None:
    found = module_cycles(_EDGES)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_cycle_in_the_selftest_not_even_a_hidden_one() -> None:
    found = hidden_cycles(_EDGES, "selftest")
    assert not found, "circles in selftest/ (move the shared piece to a module of its own):\n" + "\n".join(found)


def test_no_cycle_runs_through_a_windows_module() -> None:
    found = windows_cycles(_EDGES)
    assert not found, "circles through a Windows module:\n" + "\n".join(found)


def test_no_cycle_between_launchers_subpackages() -> None:
    found = launcher_package_cycles(_EDGES, _TREE.packages)
    assert not found, "launcher's subpackages import each other:\n" + "\n".join(found)


def test_unit_and_e2e_tests_share_helpers_only_through_support() -> None:
    tests = read(ROOT, ("tests",))
    assert any(_under(e.dst, "tests.support") for e in tests.edges(("tests",)))  # control: relative imports read
    bad = crossed_test_dirs(tests.edges(("tests",)))
    assert not bad, "move the shared helper to tests/support/:\n" + "\n".join(bad)


# ---- every rule can fail: tiny synthetic trees ------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Tree:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return read(root, ("launcher", "netguard", "fsguard", "sgbase", "selftest", "tests"))


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


def test_every_package_rule_catches_an_offender(tmp_path: Path) -> None:
    tree = _write(tmp_path, _SYNTHETIC)
    edges = tree.edges()
    assert guard_violations(edges) == [
        "fsguard/b.py:2: fsguard.b imports selftest.verify",
        "netguard/a.py:3: netguard.a imports launcher.x",  # a type-only import is a dependency too
        "netguard/a.py:5: netguard.a imports launcher.cli (in f)",  # in a function too
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
    assert launcher_package_cycles(edges, tree.packages) == [
        "launcher.platform <-> launcher.run:\n"
        "    launcher/platform/n.py:2: launcher.platform.n imports launcher.run.o (in f)\n"
        "    launcher/run/m.py:1: launcher.run.m imports launcher.platform.n"
    ]
    assert hidden_cycles([e for e in edges if not e.typing], "selftest") == []  # the type-only import closes it
    assert hidden_cycles(edges, "selftest") == [
        "selftest.verify <-> selftest.world:\n"
        "    selftest/verify.py:3: selftest.verify imports selftest.world\n"
        "    selftest/world.py:2: selftest.world imports selftest.verify (in f)"
    ]


def test_the_roles_and_config_rules_catch_an_offender(tmp_path: Path) -> None:
    tree = _write(
        tmp_path,
        {
            "netguard/__init__.py": "",
            "netguard/spec.py": "from .relay.splice import Pair\n",
            "netguard/daemon/__init__.py": "from netguard.decision import gate\n",  # the daemon may
            "netguard/decision/__init__.py": "import netguard.daemon.serve\n",
            "netguard/decision/gate.py": "from ..relay import handoff\nfrom netguard import spec\n",  # permitted
            "netguard/relay/__init__.py": "",
            "netguard/relay/handoff.py": "def f():\n    from netguard.decision import decide\nfrom netguard import audit\n",
            "netguard/relay/deep/x.py": "from netguard import daemon\n",
            "netguard/windows/__init__.py": "from netguard.daemon import serve\n",  # not a role: not checked here
            "launcher/config/hostilefile.py": "import os\nfrom sgbase import canon\n",
            "launcher/config/trust.py": "from . import yamlfile\n",
            "launcher/config/yamlfile.py": "from .hostilefile import read\nfrom .narrowing import narrow\n",
        },
    )
    edges = tree.edges()
    assert role_violations(edges, tree.packages) == [
        "netguard/decision/__init__.py:1: netguard.decision imports netguard.daemon.serve",
        "netguard/relay/deep/x.py:1: netguard.relay.deep.x imports netguard.daemon",
        "netguard/relay/handoff.py:2: netguard.relay.handoff imports netguard.decision (in f)",
        "netguard/spec.py:1: netguard.spec imports netguard.relay.splice",  # relative, resolved
    ]
    assert config_violations(edges) == [
        "launcher/config/hostilefile.py:2: launcher.config.hostilefile imports sgbase",
        "launcher/config/trust.py:1: launcher.config.trust imports launcher.config.yamlfile",
        "launcher/config/yamlfile.py:2: launcher.config.yamlfile imports launcher.config.narrowing",
    ]


def test_the_windows_and_tests_rules_catch_an_offender(tmp_path: Path) -> None:
    tree = _write(
        tmp_path,
        {
            "netguard/windows/__init__.py": "",
            "netguard/windows/wfp.py": "def f():\n    from fsguard.windows import acl\n",
            "fsguard/windows/acl.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import netguard.windows.wfp\n",
            "launcher/run/a.py": "def f():\n    from . import b\n",  # a circle without a Windows module: not this rule's
            "launcher/run/b.py": "def f():\n    from . import a\n",
            "tests/unit/test_a.py": "from ..e2e.test_b import helper\nfrom ..support.x import y\n",
            "tests/e2e/test_b.py": "from tests.unit import test_a\n",
            "tests/support/x.py": "",
        },
    )
    assert windows_cycles(tree.edges()) == [
        "fsguard.windows.acl <-> netguard.windows.wfp:\n"
        "    fsguard/windows/acl.py:3: fsguard.windows.acl imports netguard.windows.wfp\n"
        "    netguard/windows/wfp.py:2: netguard.windows.wfp imports fsguard.windows.acl (in f)"
    ]
    assert crossed_test_dirs(tree.edges(("tests",))) == [
        "tests/e2e/test_b.py:1: tests.e2e.test_b imports tests.unit.test_a",
        "tests/unit/test_a.py:1: tests.unit.test_a imports tests.e2e.test_b",
    ]


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    # The other half of the control: the rules do not fire on a tree that keeps them.
    tree = _write(
        tmp_path,
        {
            "sgbase/__init__.py": "",
            "sgbase/e.py": "import os\n",
            "netguard/a.py": "import sgbase.e\n",
            "launcher/cli.py": "import netguard.a\ndef cmd_verify():\n    from selftest import command\n",
            "selftest/command.py": "from launcher import cli\ndef f():\n    import selftest.command\n",
        },
    )
    edges = tree.edges()
    assert len(edges) == 4  # sgbase/e.py imports only os; selftest.command's self-import is no edge
    assert [i.dst for i in tree.of("sgbase.e")] == ["os"]  # the reader keeps the stdlib import (argparse rule)
    assert not guard_violations(edges) and not sgbase_violations(edges) and not selftest_importers(edges)
    assert not module_cycles(edges) and not launcher_package_cycles(edges, tree.packages)
    assert not hidden_cycles(edges, "selftest") and not windows_cycles(edges)
    assert not role_violations(edges, tree.packages) and not config_violations(edges)

"""The network guard's three roles import one way (issue 29): the daemon asks the decision, the relay moves bytes.

    netguard.daemon   -> netguard.decision, netguard.relay, netguard (spec, policy, audit, ...)
    netguard.decision -> netguard.relay, netguard          never the daemon
    netguard.relay    -> netguard                          never the decision nor the daemon
    netguard/*.py     -> none of the three                 (the spec, policy, audit below them all)

Every import counts, at any depth (a function-level import is still an arrow). A relay that imported
the decision could be made to decide; a decision that imported the daemon would close a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

NETGUARD = Path(__file__).resolve().parent.parent.parent / "netguard"
ROLES = ("daemon", "decision", "relay")
#: What each place may not import (the roles by package name; "netguard" is the top level's own modules).
FORBIDDEN = {
    "daemon": (),
    "decision": ("netguard.daemon",),
    "relay": ("netguard.daemon", "netguard.decision"),
    "netguard": tuple(f"netguard.{r}" for r in ROLES),
}


def imported(source: str) -> list[tuple[int, str]]:
    """Every module an import names (`from X import a` counts X and X.a), with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations(place: str, name: str, source: str) -> list[str]:
    """The imports of one module of `place` that point the wrong way, as file:line texts."""
    bad = FORBIDDEN[place]
    return [
        f"{name}:{line}: imports {mod}"
        for line, mod in imported(source)
        if any(mod == b or mod.startswith(b + ".") for b in bad)
    ]


def _modules() -> list[tuple[str, Path]]:
    out = [("netguard", p) for p in sorted(NETGUARD.glob("*.py"))]
    for role in ROLES:
        out += [(role, p) for p in sorted((NETGUARD / role).glob("*.py"))]
    return out


def test_the_roles_import_one_way() -> None:
    found = [v for place, p in _modules() for v in violations(place, str(p.relative_to(NETGUARD)), p.read_text())]
    assert not found, "imports against the roles:\n" + "\n".join(found)


def test_every_role_is_a_package_and_the_old_one_is_gone() -> None:
    for role in ROLES:
        assert (NETGUARD / role / "__init__.py").is_file()
        assert len(list((NETGUARD / role).glob("*.py"))) > 5  # not an empty shell: the checks above saw modules
    assert not list((NETGUARD / "proxy").glob("*.py"))  # one home per module: netguard.proxy was split, not copied


def test_the_check_sees_a_wrong_arrow_at_any_depth() -> None:
    """The checker itself: each wrong form is caught, the permitted ones are not."""
    wrong = "def f():\n    from netguard.decision import decide\n"
    assert violations("relay", "x.py", wrong) == [
        "x.py:2: imports netguard.decision",
        "x.py:2: imports netguard.decision.decide",
    ]
    assert violations("relay", "x.py", "from netguard import daemon\n") == ["x.py:1: imports netguard.daemon"]
    assert violations("decision", "x.py", "import netguard.daemon.serve\n") == ["x.py:1: imports netguard.daemon.serve"]
    assert violations("netguard", "x.py", "from netguard.relay.splice import Pair\n") != []
    assert violations("decision", "x.py", "from netguard.relay import handoff\nfrom netguard import spec\n") == []
    assert violations("daemon", "x.py", "from netguard.decision import gate\n") == []
    assert violations("relay", "x.py", "from netguard import audit\n") == []  # the top level is below every role

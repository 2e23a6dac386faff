"""win-net's binding modules (issue 28): every `fn("X")(...)` names an entry of the documented
table and passes exactly the arguments it declares (a miscounted call is a crash or garbage on
Windows, and nothing else on Linux would notice)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sgbase.windows import win32calls

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "netguard/windows/win32wfp.py",
    "fsguard/windows/win32lsa.py",
    "fsguard/windows/win32profile.py",
    "fsguard/windows/win32session.py",
    "launcher/run/windows/win32owner.py",
)


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Call):
            inner = n.func
            named = isinstance(inner.func, ast.Name) and inner.func.id == "fn"
            named |= isinstance(inner.func, ast.Attribute) and inner.func.attr == "fn"  # win32.fn
            if named and inner.args:
                arg = inner.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    out.append((arg.value, n))
    return out


@pytest.mark.parametrize("module", MODULES)
def test_every_call_is_in_the_table_with_its_declared_arity(module: str) -> None:
    calls = _calls(ast.parse((ROOT / module).read_text(encoding="utf-8")))
    assert calls, module
    for name, call in calls:
        assert name in win32calls.BY_NAME, (module, name)
        if any(isinstance(a, ast.Starred) for a in call.args):
            continue  # counted by the fake BFE at run time instead (tests/support/bfefake.py)
        assert len(call.args) == len(win32calls.BY_NAME[name].argtypes), (module, name)

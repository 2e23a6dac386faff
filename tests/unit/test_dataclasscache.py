"""sgbase.dataclasscache: record classes made from the table behave as the stdlib makes them; a
damaged or foreign table is ignored; nothing is written where bytecode is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Made in a fresh interpreter with the table at argv[1]: what the class does, and whether compiling was needed.
PROBE = """
import json, sys, dataclasses
from sgbase import dataclasscache as c
c.install(sys.argv[1])
c._missed = False  # classes the launcher package made while importing do not count

@dataclasses.dataclass(frozen=True)
class Rec:
    a: int
    b: tuple[str, ...] = ()
    c: tuple[int, ...] = dataclasses.field(default_factory=tuple)

r = Rec(1, ("x",))
try:
    r.a = 2
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
out = {"eq": r == Rec(1, ("x",)), "ne": r != Rec(2), "repr": repr(r), "frozen": frozen, "hash": hash(r) == hash(Rec(1, ("x",))),
       "replace": dataclasses.replace(r, a=5).a, "missed": c._missed}
c.save()
print(json.dumps(out))
"""


def probe(table: Path, *, dont_write: bool = False) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(table)], capture_output=True, text=True, check=True, cwd=REPO, env=env
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_classes_from_the_table_behave_as_the_stdlib_makes_them(tmp_path: Path) -> None:
    table = tmp_path / "__pycache__" / "dataclasses.marshal"
    first = probe(table)
    assert table.is_file() and first["missed"] is True
    second = probe(table)
    assert second["missed"] is False  # nothing compiled: every method came from the table
    expected = {"eq": True, "ne": True, "repr": "Rec(a=1, b=('x',), c=())", "frozen": True, "hash": True, "replace": 5}
    assert (
        {k: v for k, v in second.items() if k != "missed"}
        == expected
        == {k: v for k, v in first.items() if k != "missed"}
    )


def test_a_damaged_or_foreign_table_is_ignored(tmp_path: Path) -> None:
    table = tmp_path / "dataclasses.marshal"
    for junk in (b"", b"\x00\x01garbage", b"xxxx" + b"\x00" * 40):
        table.write_bytes(junk)
        got = probe(table)
        assert got["missed"] is True and got["eq"] is True and got["frozen"] is True


def test_nothing_is_written_under_pythondontwritebytecode(tmp_path: Path) -> None:
    table = tmp_path / "dataclasses.marshal"
    assert probe(table, dont_write=True)["eq"] is True
    assert not table.exists()


STAND_IN = """
import json, sys
import launcher  # installs the table and the stand-in for inspect (nothing imported inspect before)
import dataclasses

@dataclasses.dataclass
class A:
    '''documented'''
    x: int = 1

class Plain:
    pass

class Child(A):
    y: str

out = {"stand_in_first": type(sys.modules["inspect"]).__name__, "ast_before": "ast" in sys.modules}
stand_in = dataclasses.inspect
answers = [stand_in.get_annotations(c) for c in (A, Plain, Child)]
import inspect  # anyone's use loads the real module
out["sig"] = str(inspect.signature(lambda a, b=2: None))
from inspect import Parameter
out["param"] = Parameter.__name__
out["same"] = answers == [inspect.get_annotations(c) for c in (A, Plain, Child)]
out["fresh"] = stand_in.get_annotations(A) is not A.__annotations__
out["real_now"] = type(sys.modules["inspect"]).__name__
print(json.dumps(out))
"""


def test_the_inspect_stand_in_answers_as_inspect_and_loads_it_for_anything_else() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", STAND_IN], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    got = json.loads(out.stdout)
    assert got == {
        "stand_in_first": "_Inspect",
        "ast_before": False,  # inspect (and ast, dis, tokenize) not imported to make a dataclass
        "sig": "(a, b=2)",
        "param": "Parameter",
        "same": True,
        "fresh": True,
        "real_now": "module",
    }

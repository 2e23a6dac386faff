"""The checks CI runs on the code itself, as tests: strict types, one lint, one format, the layout limits.

They run with the README's one test command (and so in `.ci/run`), so a change that breaks one of
the house rules fails where every other regression fails. The limits keep a module readable in one
sitting and a function on one screen; each failure names file:line and the size.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ..support.importgraph import imports_of, module_name

ROOT = Path(__file__).resolve().parent.parent.parent
#: The packages the layout limits apply to (tests are exempt: a table of cases may run long).
PACKAGES = ("launcher", "netguard", "fsguard", "sgbase", "selftest", "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """One tool from this interpreter's environment, from the checkout's root (where its config is)."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def test_mypy_strict() -> None:
    # One run over the files pyproject.toml names; the cache (.mypy_cache) makes a rerun take seconds.
    r = _run("mypy", "--strict")
    assert r.returncode == 0, f"mypy --strict:\n{r.stdout}{r.stderr}"


def test_ruff_check() -> None:
    r = _run("ruff", "check", "--output-format", "concise", ".")
    assert r.returncode == 0, f"ruff check:\n{r.stdout}{r.stderr}"


def test_ruff_format() -> None:
    r = _run("ruff", "format", "--check", ".")
    assert r.returncode == 0, f"ruff format --check (run `ruff format` on these files):\n{r.stdout}{r.stderr}"


def _modules() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def oversized_modules(paths: list[Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    """'file:1: N lines' for every module longer than `limit` lines."""
    out = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{_name(path)}:1: {lines} lines (limit {limit})")
    return out


def oversized_functions(paths: list[Path], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:line: name() N lines' for every function or method longer than `limit`, def line to last line."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > limit:
                    out.append(f"{_name(path)}:{node.lineno}: {node.name}() {size} lines (limit {limit})")
    return out


def test_no_module_over_the_limit() -> None:
    found = oversized_modules(_modules())
    assert not found, "modules over the limit:\n" + "\n".join(found)


def test_no_function_over_the_limit() -> None:
    found = oversized_functions(_modules())
    assert not found, "functions over the limit:\n" + "\n".join(found)


def test_the_size_checks_catch_an_offender(tmp_path: Path) -> None:
    # Control: a check that never finds anything could be measuring nothing.
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    module = tmp_path / "m.py"
    module.write_text(f"class C:\n    def fits(self):\n{body}\n    async def over(self):\n{body}        return 1\n")
    assert oversized_functions([module]) == [f"{module}:63: over() 61 lines (limit 60)"]
    assert oversized_modules([module], limit=122) == [f"{module}:1: 123 lines (limit 122)"]
    assert oversized_modules([module]) == []


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject lists packages by hand (the allowlists ride along under another name): none may be missing,
    or `pip install --user`, pipx and uv tool would install a sandgate that fails on import."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        str(init.parent.relative_to(ROOT)).replace("/", ".")
        for top in ("launcher", "netguard", "fsguard", "sgbase", "selftest")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert "launcher.allowlists" in listed


#: argparse stops at the CLI (issue 29): below it every body gets typed records. Besides the CLI's three
#: parsing modules (the entry, the less used commands' parsers, what both share), completion.py walks the
#: parser itself for shtab (it never sees a namespace), and a separate program's own entry point (its
#: parser's prog is "python -m ...") parses its own argv.
ARGPARSE_HOMES = ("launcher/cli.py", "launcher/cliparsers.py", "launcher/cliargs.py")
PARSER_WALKERS = ("launcher/completion.py",)


def argparse_violations(root: Path) -> list[str]:
    """Modules other than ARGPARSE_HOMES that import argparse (PARSER_WALKERS may) or name argparse.Namespace."""
    bad = []
    for top in ("launcher", "netguard", "fsguard", "sgbase", "selftest"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            text = path.read_text()
            if rel in ARGPARSE_HOMES or 'ArgumentParser(prog="python -m ' in text:
                continue
            if rel not in PARSER_WALKERS:
                bad += [
                    f"{rel}:{i.line}: imports {i.dst}"
                    for i in imports_of(module_name(root, path), rel, text, set())
                    if i.dst.split(".")[0] == "argparse"
                ]
            bad += [
                f"{rel}:{n}: names argparse.Namespace"
                for n, s in enumerate(text.splitlines(), 1)
                if "argparse.Namespace" in s
            ]
    return bad


def test_argparse_stops_at_the_cli() -> None:
    bad = argparse_violations(ROOT)
    assert not bad, "pass typed records made by the CLI (cliargs.typed), not the namespace:\n" + "\n".join(bad)


def test_the_argparse_check_catches_an_offender(tmp_path: Path) -> None:
    (tmp_path / "launcher" / "run").mkdir(parents=True)
    (tmp_path / "netguard").mkdir()
    (tmp_path / "launcher" / "cli.py").write_text("import argparse\ndef f(a: argparse.Namespace) -> None: ...\n")
    (tmp_path / "launcher" / "completion.py").write_text(
        "import argparse\ndef f(a: 'argparse.Namespace') -> None: ...\n"
    )
    (tmp_path / "launcher" / "run" / "a.py").write_text("def f(args):\n    from argparse import Namespace\n")
    (tmp_path / "netguard" / "m.py").write_text('import argparse\nap = argparse.ArgumentParser(prog="python -m x")\n')
    assert argparse_violations(tmp_path) == [
        "launcher/completion.py:2: names argparse.Namespace",
        "launcher/run/a.py:2: imports argparse",
    ]

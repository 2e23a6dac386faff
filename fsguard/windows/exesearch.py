"""Which file CMD's first word names, found by sandgate itself (pure; existence is the caller's).

Why (issue 28, W5): with lpApplicationName NULL, CreateProcessWithLogonW's executable is searched
by the Secondary Logon service with the service's own PATH, so `python` from setup-python, per-user
tools and `.cmd` shims (npm, yarn) fail with error 2. So the name is resolved here, with the
run's own PATH and PATHEXT, and passed as lpApplicationName (a full path: that parameter is never
searched). Batch files cannot be started directly: they run under %ComSpec% /c (CreateProcess's
documented way), with every argument quoted and the characters cmd.exe would still expand inside
quotes refused (the BatBadBut class: an argument must never become a second command).
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass

DEFAULT_PATHEXT = ".COM;.EXE;.BAT;.CMD"
RUNNABLE = (".exe", ".com")
BATCH = (".bat", ".cmd")
#: Characters cmd.exe acts on even inside double quotes, or that end the quoting.
BATCH_UNSAFE = frozenset('"%!\r\n')


class ExeSearchError(ValueError):
    """CMD's first word names nothing runnable; the text says what to do."""


@dataclass(frozen=True)
class Resolved:
    application: str  # lpApplicationName
    cmdline: str  # lpCommandLine


def _env(env: Mapping[str, str], name: str) -> str:
    return next((v for k, v in env.items() if k.casefold() == name.casefold()), "")


def _candidates(word: str, env: Mapping[str, str], cwd: str) -> list[str]:
    exts = [e.strip().lower() for e in (_env(env, "PATHEXT") or DEFAULT_PATHEXT).split(";") if e.strip()]
    names = [word] if ntpath.splitext(word)[1].lower() in exts else [word + e for e in exts]
    if ntpath.dirname(word) or ntpath.splitdrive(word)[0]:
        return [ntpath.normpath(ntpath.join(cwd, n)) for n in names]
    # Bare names: PATH only, never the current directory first (NoDefaultCurrentDirectoryInExePath):
    # a workspace's planted git.exe must not stand in for the real one.
    dirs = [d.strip().strip('"') for d in _env(env, "PATH").split(";") if d.strip()]
    return [ntpath.join(d, n) for d in dirs if ntpath.isabs(d) for n in names]


def app_alias(path: str) -> bool:
    """An App Execution Alias (`%LOCALAPPDATA%\\Microsoft\\WindowsApps\\python.exe`, on every default
    user PATH): a link into a Store package installed for that user only, so it does not start as the
    sandbox user (openai/codex#35871: "Windows refuses to launch that packaged binary")."""
    parts = [p.casefold() for p in ntpath.normpath(path).split("\\")]
    # in the folder or a package folder below it (`WindowsApps\<package>\winget.exe`: r4-run N2)
    return any(parts[i : i + 4] == ["appdata", "local", "microsoft", "windowsapps"] for i in range(len(parts) - 4))


def resolve(argv: tuple[str, ...], env: Mapping[str, str], cwd: str, is_file: Callable[[str], bool]) -> Resolved:
    if not argv or not argv[0]:
        raise ExeSearchError("no command given")
    hits = (c for c in _candidates(argv[0], env, cwd) if is_file(c))
    found, alias = None, None
    for hit in hits:
        if not app_alias(hit):
            found = hit
            break
        alias = alias or hit  # a later PATH entry may hold the real program (python.org's, not the Store stub)
    if found is None and alias is not None:
        raise ExeSearchError(
            f"{argv[0]}: only {alias} was found, a Microsoft Store alias that runs only for your own account; "
            "install the tool for all users (e.g. python.org's installer, 'Install for all users') or give "
            "its full path"
        )
    if found is None and (ntpath.dirname(argv[0]) or ntpath.splitdrive(argv[0])[0]):
        raise ExeSearchError(f"{argv[0]}: no such program")
    if found is None:
        raise ExeSearchError(f"{argv[0]}: command not found in PATH; give its full path")
    ext = ntpath.splitext(found)[1].lower()
    if ext in RUNNABLE:
        return Resolved(found, cmdline(argv))
    if ext in BATCH:
        return _batch(found, argv, env)
    raise ExeSearchError(f"{found}: a {ext} file is not a program; run it through its interpreter")


def _quote(arg: str) -> str:
    """One argument as the Microsoft C runtime's parser reads it back (CommandLineToArgvW rules):
    quoted when it holds blanks or quotes; backslashes doubled only before a quote."""
    if arg and not any(c in arg for c in ' \t"'):
        return arg
    out, slashes = ['"'], 0
    for c in arg:
        if c == "\\":
            slashes += 1
            continue
        out.append("\\" * (slashes * 2 + 1 if c == '"' else slashes) + c)
        slashes = 0
    out.append("\\" * (slashes * 2) + '"')
    return "".join(out)


def cmdline(argv: tuple[str, ...]) -> str:
    return " ".join(_quote(a) for a in argv)


def _bat_arg(arg: str) -> str:
    """One quoted batch argument. cmd.exe ignores backslashes, but a shim hands `%*` on to a program
    that parses like the C runtime (node for npm.cmd), where `\\"` is a literal quote: trailing
    backslashes are doubled so the closing quote stays one (as Rust's BatBadBut fix does)."""
    stripped = arg.rstrip("\\")
    doubled = "\\" * (2 * (len(arg) - len(stripped)))
    return f'"{stripped}{doubled}"'


def _batch(found: str, argv: tuple[str, ...], env: Mapping[str, str]) -> Resolved:
    bad = next((a for a in argv[1:] if BATCH_UNSAFE & set(a)), None)
    if bad is not None:
        raise ExeSearchError(
            f"{ntpath.basename(found)} is a batch file and the argument {bad!r} holds a character cmd.exe "
            'would expand (" % ! or a line break); call the program the script wraps directly'
        )
    if BATCH_UNSAFE & set(found):  # cmd.exe expands %VAR% in the script's own path too
        raise ExeSearchError(f"{found}: a batch file whose path holds % or ! cannot be run safely; move or rename it")
    comspec = _env(env, "ComSpec") or r"C:\Windows\System32\cmd.exe"
    line = " ".join((f'"{found}"', *(_bat_arg(a) for a in argv[1:])))
    return Resolved(comspec, f'"{comspec}" /d /s /c "{line}"')

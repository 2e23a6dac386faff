"""r4-run N2: `%LOCALAPPDATA%\\Microsoft\\WindowsApps` (on every default user PATH) is never read-granted, and
an alias one folder down (`WindowsApps\\<package>\\winget.exe`) is known as one.

Why: every entry there is an App Execution Alias (IO_REPARSE_TAG_APPEXECLINK) that starts only for its
owner, so exesearch refuses them and a grant buys nothing; SetNamedSecurityInfoW pushes an inheritable
ACE onto each of them, which is not known to succeed ("The file cannot be accessed by the system").
"""

from __future__ import annotations

from fsguard.windows import acl, exesearch

HOME = r"C:\Users\me"
ALIASES = HOME + r"\AppData\Local\Microsoft\WindowsApps"


def test_the_alias_folder_and_its_package_folders_are_not_read_granted() -> None:
    npm = HOME + r"\AppData\Roaming\npm"
    env = {"Path": ";".join([r"C:\Windows\system32", npm, ALIASES, ALIASES.lower() + "\\", ALIASES + r"\Pkg_x"])}
    assert acl.toolchain_dirs(env, HOME) == (npm,)


def test_an_alias_in_a_package_folder_is_an_alias_and_a_lookalike_is_not() -> None:
    assert exesearch.app_alias(ALIASES + r"\Microsoft.DesktopAppInstaller_8wekyb3d8bbwe\winget.exe")
    assert exesearch.app_alias(ALIASES + r"\python.exe")
    assert not exesearch.app_alias(HOME + r"\AppData\Local\Microsoft\WindowsAppsX\python.exe")
    assert not exesearch.app_alias(r"C:\Program Files\WindowsApps\python.exe")


def test_the_package_alias_is_refused_in_one_line_before_windows_is_asked() -> None:
    exe = ALIASES + r"\Microsoft.DesktopAppInstaller_8wekyb3d8bbwe\winget.exe"
    env = {"PATH": ALIASES + r"\Microsoft.DesktopAppInstaller_8wekyb3d8bbwe", "PATHEXT": ".EXE"}
    try:
        exesearch.resolve(("winget", "list"), env, r"C:\w", {exe}.__contains__)
    except exesearch.ExeSearchError as e:
        assert "Microsoft Store alias" in str(e)
    else:
        raise AssertionError("the package alias was taken as the program")

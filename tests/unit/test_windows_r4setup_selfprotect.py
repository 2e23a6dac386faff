r"""r4-setup (round four, `sandgate setup` in execution order): the self-protection of sandgate's code
folders on the interpreters a Windows user really has.

R1: the Microsoft Store's Python lives in `C:\Program Files\WindowsApps\<package>`, TrustedInstaller's and
read-only to everyone ("These types of apps cannot normally write to their installation directory",
https://learn.microsoft.com/en-us/uwp/schemas/appxpackage/uapmanifestschema/element-uap10-installedlocationvirtualization):
SetNamedSecurityInfoW needs WRITE_DAC there, which administrators do not hold, so setup must skip it, not fail.
R2: `python -m launcher.cli` names launcher\cli.py in sys.argv[0] (docs.python.org/3/library/sys.html#sys.argv);
its folder lies inside a recorded code folder and must not make every such run "not set up"."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fsguard.windows import selfprotect, win32selfprotect
from launcher.run.windows import setup
from sgbase.windows.api import WinApiError
from tests.support import ntfsmodel, winfake
from tests.support.winfake import HOME, FakeWinApi

TRUSTED_INSTALLER = "S-1-5-80-956008885-3418522649-1831038044-1853292631-2271478464"
PF = r"C:\Program Files"
PKG = PF + r"\WindowsApps\PythonSoftwareFoundation.Python.3.12_3.12.2800.0_x64__qbz5n2kfra8p0"
#: a package folder: TrustedInstaller owns it; administrators, users and SYSTEM may read and run, nobody else writes
PKG_DACL = f"D:PAI(A;OICI;FA;;;{TRUSTED_INSTALLER})(A;OICI;0x1200a9;;;SY)(A;OICI;0x1200a9;;;BA)(A;OICI;0x1200a9;;;BU)"
LOCAL_SITE = HOME + r"\AppData\Local\Packages\PythonSoftwareFoundation.Python.3.12_qbz5n2kfra8p0\LocalCache"
SYSTEM = (r"C:\Windows", PF, r"C:\Program Files (x86)")


def _store_machine() -> FakeWinApi:
    api = FakeWinApi()
    api.env.update({"SystemRoot": SYSTEM[0], "ProgramFiles": SYSTEM[1], "ProgramFiles(x86)": SYSTEM[2]})
    for d in ("C:\\", PF, PF + r"\WindowsApps", PKG, PKG + r"\Lib", PKG + r"\DLLs"):
        api.m.dirs.add(d)
        api.m.dacls[d] = PKG_DACL
        api.m.owners[d] = TRUSTED_INSTALLER
    api.code = (PKG, PKG + r"\DLLs", PKG + r"\Lib", LOCAL_SITE + r"\local-packages\Python312\site-packages")
    return api


def test_the_store_python_is_set_up_without_touching_its_package() -> None:
    api = _store_machine()
    with pytest.raises(WinApiError, match="error 5"):  # the fake's contract: WRITE_DAC, which nobody has here
        api.set_dacl(PKG, PKG_DACL + "(D;OICI;0xd0156;;;S-1-5-21-1-2-3-1001)")
    said: list[str] = []
    setup.setup(api, said.append)  # before the fix: "cannot set the ACL of ...WindowsApps...": never set up
    assert all(api.m.dacls[p] == PKG_DACL for p in (PKG, PKG + r"\Lib", PKG + r"\DLLs"))  # nothing changed
    assert any(PKG in line and "Microsoft Store package" in line for line in said)
    assert setup.check(api).record.protected == ()  # and every run of it finds the setup complete
    fs = ntfsmodel.Ntfs(api.m, winfake.sandbox_sid(api))  # the sandbox user cannot write there anyway
    with pytest.raises(ntfsmodel.Denied):
        fs.write(PKG + r"\Lib\sitecustomize.py", b"x")


def test_store_packages_on_any_volume_are_skipped_and_other_program_files_folders_are_not() -> None:
    moved = r"D:\WindowsApps\PythonSoftwareFoundation.Python.3.12_x64__qbz5n2kfra8p0"
    p = selfprotect.plan((PKG, moved, PF + r"\Python312", r"D:\WindowsAppsNot\py"), HOME, SYSTEM)
    assert {path for path, _ in p.skipped} == {PKG, moved}
    assert [e.path for e in p.edits if e.kind == "code"] == [PF + r"\Python312", r"D:\WindowsAppsNot\py"]
    assert PKG in selfprotect.code_folders(p)  # still a folder no run may write into


def test_python_dash_m_does_not_add_a_folder_inside_the_code_it_runs_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import launcher

    main = Path(launcher.__file__).parent / "cli.py"
    assert main.is_file()
    monkeypatch.setattr(sys, "argv", [str(main), "run"])  # `python -m launcher.cli run`
    assert str(main.parent) not in win32selfprotect.sources()  # before: ...\launcher, never recorded: refused
    outside = tmp_path / "tool.py"
    outside.write_text("")
    monkeypatch.setattr(sys, "argv", [str(outside)])
    assert os.path.abspath(tmp_path) in win32selfprotect.sources()  # a script elsewhere still names its folder


def test_an_all_users_conda_gets_its_deny_but_programdata_itself_no_guard() -> None:
    """R6: `C:\\ProgramData\\miniconda3` (conda's all-users default). Users hold no DELETE on %ProgramData% and
    no FILE_DELETE_CHILD on the root, so a guard there protects nothing; setting it would make Windows walk every
    subtree in %ProgramData% (Defender's, the package cache...) under SetNamedSecurityInfo's propagation
    (learn.microsoft.com/windows/win32/secauthz/automatic-propagation-of-inheritable-aces: "the system imposes
    the current inheritance model on the ACLs of all objects in the hierarchy below the target object")."""
    api = FakeWinApi()
    api.env.update({"SystemRoot": r"C:\Windows", "ProgramFiles": PF, "ProgramData": r"C:\ProgramData"})
    conda = r"C:\ProgramData\miniconda3"
    for d in ("C:\\", r"C:\ProgramData", conda, conda + r"\Lib", conda + r"\Lib\site-packages"):
        api.m.dirs.add(d)
        api.m.dacls[d] = "D:AI"
    api.code = (conda, conda + r"\Lib", conda + r"\Lib\site-packages")
    setup.setup(api, lambda _: None)
    touched = {c[1][0] for c in api.calls if c[0] == "set_dacl"}
    assert conda in touched and r"C:\ProgramData" not in touched  # before: a guard (and a walk) on ProgramData
    assert setup.check(api).code[0] == conda

"""r3-c3: `sandgate verify`'s `self_code` row. Its judge (ok / FAIL / GAP), its prepare (a scratch
folder right under the system drive root, removed after), its script run for real here, and the
whole row through verify's runner against the fake WinApi and the NTFS model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fsguard.windows.launch import Launch
from launcher.run.windows import setup
from selftest.windows import allbodies, probebody, probes, probeself, verifyrun
from sgbase.windows import state
from tests.support import ntfsmodel, winfake
from tests.support.winfake import APPDATA, FakeWinApi

ROOT_DACL = "D:PAI(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)(A;OICI;0x1200a9;;;BU)(A;OICIIO;SDGRGWGX;;;AU)(A;;LC;;;AU)"
CODE = r"C:\Python312"


def _got(protected: dict[str, list[str]], scratch: list[str] | None, control: bool = True) -> dict[str, Any]:
    return {"control": control, "protected": protected, "scratch": [r"C:\sandgate-verify-1", scratch]}


def test_the_judge_passes_only_refusals_and_shows_the_drive_root_gap() -> None:
    denied = {CODE: ["denied", "[Errno 13]"]}
    assert probeself.judge(0, _got(denied, ["denied", "x"])).ok
    gap = probeself.judge(0, _got(denied, ["wrote", r"C:\sandgate-verify-1\x.pth"]))
    assert not gap.ok and gap.gap and r"C:\sandgate-verify-1" in gap.detail  # GAP, never a pass
    for bad in (
        _got({CODE: ["wrote", "p"]}, ["denied", "x"]),  # the hole itself
        _got({CODE: ["error", "no such folder"]}, ["denied", "x"]),  # not a refusal: proves nothing
        _got(denied, ["denied", "x"], control=False),  # its own workspace unwritable: proves nothing
        _got(denied, None),  # no scratch folder: the gap was not looked at
        _got(denied, ["error", "disk full"]),
    ):
        v = probeself.judge(0, bad)
        assert not v.ok and not v.gap, bad
    assert not probeself.judge(1, None).ok
    assert "self_code" in probes.WINDOWS_ONLY and probeself.BODIES[0] in allbodies.bodies()


def test_prepare_makes_a_folder_right_under_the_system_drive_and_undo_takes_it_away() -> None:
    api = FakeWinApi()
    api.m.dirs.add("D:\\")
    api.env["SystemDrive"] = "D:"
    rec = state.SetupRecord("sandgate-x", "S-1-5-21-9", 3128, ((CODE, "code"), (r"C:\x", "guard")))
    api.m.files[state.setup_record(APPDATA)] = state.encode(rec)
    workdir = winfake.APPDATA
    undo = probeself.prepare(api, workdir)
    targets = json.loads(api.m.files[workdir + "\\" + probeself.TARGETS])
    assert targets["protected"] == [CODE]  # the folders, not the guarded ancestors
    scratch = targets["scratch"]
    assert scratch.startswith("D:\\sandgate-verify-") and scratch.count("\\") == 1 and scratch in api.m.dirs
    api.m.files[scratch + "\\sandgate-probe-left.pth"] = b""  # left by a killed probe
    undo()
    assert scratch not in api.m.dirs and workdir + "\\" + probeself.TARGETS not in api.m.files


def test_the_script_runs_and_reports_what_it_wrote(tmp_path: Path) -> None:
    """The body's Python for real (here: as root, so every existing folder is writable)."""
    (tmp_path / "code").mkdir()
    (tmp_path / "scratch").mkdir()
    targets = {"protected": [str(tmp_path / "code"), str(tmp_path / "gone")], "scratch": str(tmp_path / "scratch")}
    (tmp_path / probeself.TARGETS).write_text(json.dumps(targets))
    (tmp_path / probebody.SCRIPT_FILE).write_text(probeself.SCRIPT)
    subprocess.run([sys.executable, "-I", probebody.SCRIPT_FILE, "self_code"], cwd=tmp_path, check=True, timeout=60)
    got = json.loads((tmp_path / probebody.RESULT).read_text())
    assert got["control"] and got["protected"][str(tmp_path / "code")][0] == "wrote"
    assert got["protected"][str(tmp_path / "gone")][0] == "error" and got["scratch"][1][0] == "wrote"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".pth")) == []  # removed again
    assert not probeself.judge(0, got).ok


def _program(api: FakeWinApi, launch: Launch, desk: str) -> int:
    """The body as the sandbox user against the NTFS model: the script's attempts, its RESULT."""
    fs = ntfsmodel.Ntfs(api.m, api.m.users[launch.user][0])
    targets = json.loads(api.m.files[launch.cwd + "\\" + probeself.TARGETS])

    def attempt(folder: str) -> list[str]:
        try:
            fs.write(folder + "\\sandgate-probe-1.pth", b"")
        except ntfsmodel.Denied as e:
            return ["denied", str(e)]
        del api.m.files[folder + "\\sandgate-probe-1.pth"]
        return ["wrote", folder]

    got = {
        "control": attempt(launch.cwd)[0] == "wrote",
        "protected": {d: attempt(d) for d in targets["protected"]},
        "scratch": [targets["scratch"], attempt(targets["scratch"])],
    }
    api.m.files[launch.cwd + "\\" + probebody.RESULT] = json.dumps(got).encode()
    return 0


def test_the_row_through_verify_denied_code_and_the_drive_root_gap(monkeypatch: Any) -> None:
    api = FakeWinApi()
    for d, dacl in (("C:\\", ROOT_DACL), (CODE, "D:AI")):
        api.m.dirs.add(d)
        api.m.dacls[d] = dacl
    api.m.dacls[winfake.APPDATA] = winfake.BASE_DACL + f"(A;OICI;FA;;;{winfake.REAL_SID})"
    api.code = (CODE,)
    api.m.files[api.python()] = b"MZ"  # C:\Python312\python.exe: the interpreter the probes run with
    winfake.set_up(api)
    api.program = _program
    rows = verifyrun.run_rows(api, probeself.BODIES, lambda _: None)
    ((name, v),) = rows
    assert name == "self_code" and not v.ok and v.gap, v.detail  # the drive root's default: GAP
    assert "1 of sandgate's own folders refused" in v.detail
    assert not [d for d in api.m.dirs if "sandgate-verify-" in d]  # scratch folders gone
    setup.remove(api, lambda _: None)  # without the deny: the same row fails
    api.m.users.clear()
    winfake.set_up(api)
    api.m.dacls[CODE] = "D:AI"
    rec = state.decode(api.m.files[state.setup_record(APPDATA)])
    monkeypatch.setattr(setup, "_check_self", lambda a, r: ())  # the run's check off, to see the probe judge
    assert rec.protected
    ((_, bad),) = verifyrun.run_rows(api, probeself.BODIES, lambda _: None)
    assert not bad.ok and not bad.gap and CODE in bad.detail

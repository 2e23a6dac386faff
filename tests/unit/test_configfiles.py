"""Which files configure a run, and which names of them the run could redirect (issue 24, item 1).

launcher/run/configfiles.py: every --policy file and include, --upstream-ca, the --approvals socket
and the audit log under a writable root becomes a protected path (its real path); a name that
reaches its file through a symlink or a '..' the command could replace is refused in one line.
The kernel side (EROFS, EBUSY) is tests/e2e/test_config_files_e2e.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsguard import policy as fspolicy
from launcher.config.load import build_policy
from launcher.errors import RunError
from launcher.run import configfiles
from launcher.run.configfiles import ConfigFile
from launcher.run.options import RunOptions


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace, a directory outside it) with a policy, an include, a CA and symlinks."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "conf").mkdir(parents=True)
    out.mkdir()
    (ws / "agent.yaml").write_text("version: 1\ninclude: [./conf/extra.yaml]\n")
    (ws / "conf" / "extra.yaml").write_text("version: 1\n")
    (ws / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (out / "outside.yaml").write_text("version: 1\n")
    return ws, out


def _plan(roots: Path, *names: Path | str) -> tuple[str, ...]:
    return configfiles.plan(tuple(ConfigFile(str(n), "policy file") for n in names), (str(roots),))


def test_files_under_a_writable_root_are_held_by_their_real_path(tmp_path: Path) -> None:
    ws, out = _tree(tmp_path)
    (out / "ws-link").symlink_to(ws)  # a symlink outside the writable root: the command cannot change it
    held = _plan(ws, ws / "agent.yaml", out / "ws-link" / "conf" / "extra.yaml", out / "outside.yaml")
    assert held == (str(ws / "agent.yaml"), str(ws / "conf" / "extra.yaml"))  # not the one outside
    assert _plan(ws, ws / "missing.yaml") == ()  # a file that does not exist configures nothing


@pytest.mark.parametrize(
    "name,where",
    [
        ("link.yaml", "link.yaml (a symlink"),
        ("conf-link/extra.yaml", "conf-link (a symlink"),
        ("conf/../agent.yaml", "conf/.. ('..'"),
    ],
)
def test_a_name_the_command_could_redirect_is_refused_in_one_line(tmp_path: Path, name: str, where: str) -> None:
    ws, _ = _tree(tmp_path)
    (ws / "link.yaml").symlink_to("agent.yaml")
    (ws / "conf-link").symlink_to("conf")
    with pytest.raises(RunError) as e:
        _plan(ws, f"{ws}/{name}")
    msg = str(e.value)
    assert f"{ws}/{where}" in msg and "\n" not in msg and "name it by its real path" in msg, msg


def test_a_writable_root_cannot_be_configuration(tmp_path: Path) -> None:
    ws, _ = _tree(tmp_path)
    with pytest.raises(RunError, match="is itself a writable path"):
        configfiles.plan((ConfigFile(str(ws / "ca.pem"), "--upstream-ca"),), (str(ws), str(ws / "ca.pem")))


def test_the_private_tmp_is_no_root_and_every_configuring_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, out = _tree(tmp_path)
    monkeypatch.chdir(ws)
    eff = fspolicy.effective(fspolicy.FsPolicy(), cwd=str(ws), home=str(out), extra_write=(str(out),))
    assert eff.private_tmp and configfiles.writable_roots(eff) == (str(ws), str(out))
    pol = build_policy([Path("agent.yaml")], ["pypi"], [])
    opts = RunOptions(
        cmd=["true"],
        audit_path=out / "audit.jsonl",
        user=None,
        policy=pol,
        approvals=str(out / "approvals.sock"),
        upstream_ca_file="ca.pem",
    )
    named = {(f.what, f.path) for f in configfiles.of_run(opts)}
    assert {p for w, p in named if w == "policy file"} >= {str(ws / "agent.yaml"), str(ws / "conf" / "extra.yaml")}
    assert any(p.endswith("allowlists/pypi.yaml") for w, p in named if w == "policy file")
    assert ("--upstream-ca", str(ws / "ca.pem")) in named and ("audit log", str(out / "audit.jsonl")) in named
    assert ("--approvals socket", str(out / "approvals.sock")) in named
    (out / "audit.jsonl").touch()
    held = {p for p, is_dir in configfiles.protect(eff, configfiles.of_run(opts)).protect if not is_dir}
    assert {str(ws / "agent.yaml"), str(ws / "conf" / "extra.yaml"), str(ws / "ca.pem")} <= held
    assert str(out / "audit.jsonl") in held and str(out / "approvals.sock") not in held  # missing: nothing to hold


def test_a_held_file_with_another_name_is_refused_and_one_name_is_held(tmp_path: Path) -> None:
    ws, _ = _tree(tmp_path)
    (ws / "cache").mkdir()
    (ws / "cache" / "a").hardlink_to(ws / "agent.yaml")  # made by an earlier run that did not name it
    with pytest.raises(RunError, match=r"has 2 hard links.*remove the others"):
        _plan(ws, ws / "agent.yaml")
    (ws / "cache" / "a").unlink()
    assert _plan(ws, ws / "agent.yaml") == (str(ws / "agent.yaml"),)


def test_the_installation_is_named_and_held_only_where_a_run_could_write() -> None:
    names = [f.path for f in configfiles.installation()]
    here = Path(configfiles.__file__).resolve().parent.parent  # launcher/
    assert str(here) in names and str(here.parent / "netguard") in names and sys.prefix in names
    assert str(here.parent / "sgbase") in names and str(here.parent / "selftest") in names  # issue 29: the new tops
    assert configfiles.plan(configfiles.installation(), ("/nonexistent-root",)) == ()
    held = configfiles.plan(configfiles.installation(), (str(here.parent),))  # a run started in the checkout
    assert str(here) in held and str(here.parent / "allowlists") in held

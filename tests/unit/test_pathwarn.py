"""launcher.run.pathwarn: PATH entries the sandbox cannot see are named before the command runs."""

from __future__ import annotations

from fsguard import mounts
from launcher.run import pathwarn


def plan(**kw: object) -> mounts.MountPlan:
    base: dict[str, object] = dict(
        private_tmp=True, tmp_rebinds=("/tmp/ws",), pins=(), protect=(), placeholders=(),
        hide_dirs=("/home/u/.ssh", "/run/user/1000"), hide_files=(), write_roots=("/tmp/ws", "/tmp"),
    )  # fmt: skip
    base.update(kw)
    return mounts.MountPlan(**base)  # type: ignore[arg-type]


def test_a_venv_under_the_host_tmp_and_a_hidden_dir_are_named_once_each() -> None:
    path = "/tmp/venv/bin:/usr/bin:/tmp/venv/bin:/tmp/ws/bin:relative/bin:/run/user/1000/bin:/gone"
    got = pathwarn.unseen(path, plan(), resolve=lambda p: p, exists=lambda p: p != "/gone")
    assert [(u.entry, u.why, u.under) for u in got] == [
        ("/tmp/venv/bin", "private-tmp", "/tmp/venv/bin"),
        ("/run/user/1000/bin", "hidden", "/run/user/1000"),
    ]
    assert "--write /tmp/venv shows it" in pathwarn.message(got[0])
    assert "sandgate hides /run/user/1000" in pathwarn.message(got[1])


def test_a_symlink_into_the_host_tmp_is_judged_by_its_target_and_no_private_tmp_means_no_warning() -> None:
    got = pathwarn.unseen("/opt/tool/bin", plan(), resolve=lambda p: "/tmp/x/bin", exists=lambda p: True)
    assert [u.why for u in got] == ["private-tmp"]
    assert pathwarn.unseen("/tmp/venv/bin", plan(private_tmp=False, hide_dirs=()), exists=lambda p: True) == []
    assert pathwarn.unseen(None, plan()) == []


def test_view_root() -> None:
    assert pathwarn.view_root("/tmp/venv/bin") == "/tmp/venv"
    assert pathwarn.view_root("/tmp/bin") == "/tmp/bin"
    assert pathwarn.view_root("/tmp/tools/") == "/tmp/tools"

"""The home layers' pure-ish parts (issue 23): folding an upper directory into a layer as overlayfs
would stack them, removing read-only trees, and telling live runs from dead ones.

Whiteouts are made as overlayfs makes them (a 0:0 character device, allowed unprivileged since
Linux 5.8) and opaque directories with its `user.overlay.opaque` xattr, on /var/tmp (tmpfs before
6.6 has no user xattrs). Unprivileged cases run in a child that became `nobody`.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsguard import homeoverlay, layermerge, layerstore

NOBODY = 65534


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sandgate-test-layers-", dir="/var/tmp"))
    try:
        yield d
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(d)], capture_output=True, check=False)  # our own temp dir
        shutil.rmtree(d, ignore_errors=True)


def whiteout(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def tree(root: Path) -> dict[str, str]:
    """path -> 'file:TEXT', 'dir', 'opaque-dir', 'whiteout' or 'link:TARGET'."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link:{os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "opaque-dir" if layermerge._opaque(str(p), st) else "dir"
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                out[rel] = "whiteout"
            else:
                out[rel] = f"file:{p.read_text()}"
    return out


def make(root: Path, spec: dict[str, str]) -> None:
    for rel, what in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if what == "dir":
            p.mkdir(exist_ok=True)
        elif what == "opaque-dir":
            p.mkdir(exist_ok=True)
            os.setxattr(p, "user.overlay.opaque", b"y")
        elif what == "whiteout":
            whiteout(p)
        elif what.startswith("link:"):
            p.symlink_to(what[5:])
        else:
            p.write_text(what.removeprefix("file:"))


def test_folding_follows_overlayfs_stacking(tmp: Path) -> None:
    upper, layer, trash = tmp / "upper", tmp / "layer", tmp / "trash"
    for d in (upper, layer, trash):
        d.mkdir()
    make(
        layer,
        {
            "keep": "file:old",
            "replaced": "file:old",
            "gone": "file:old",
            "gone-dir/x": "file:old",
            "merged/old": "file:old",
            "opaqued/old": "file:old",
            "dir-to-file/x": "file:old",
            "file-to-dir": "file:old",
            "link": "link:/etc",
        },
    )
    make(
        upper,
        {
            "replaced": "file:new",
            "gone": "whiteout",
            "gone-dir": "whiteout",
            "merged/new": "file:new",
            "opaqued": "opaque-dir",
            "opaqued/new": "file:new",
            "dir-to-file": "file:new",
            "file-to-dir/y": "file:new",
            "link/z": "file:new",  # a directory where the layer has a symlink: never followed
            "fresh/deep/f": "file:new",
        },
    )
    assert layermerge.merge(upper, layer, trash) == []
    assert tree(layer) == {
        "keep": "file:old",
        "replaced": "file:new",
        "gone": "whiteout",
        "gone-dir": "whiteout",
        "merged": "dir",
        "merged/old": "file:old",
        "merged/new": "file:new",
        "opaqued": "opaque-dir",
        "opaqued/new": "file:new",
        "dir-to-file": "file:new",
        "file-to-dir": "dir",
        "file-to-dir/y": "file:new",
        "link": "dir",
        "link/z": "file:new",
        "fresh": "dir",
        "fresh/deep": "dir",
        "fresh/deep/f": "file:new",
    }
    assert not os.path.exists("/etc/z")


def as_nobody(fn: Callable[[], None]) -> None:
    """Run fn in a child that became nobody; its failure fails the test."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            fn()
            code = 0
        except BaseException as e:
            os.write(2, f"in the child: {e!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_ordinary_user_folds_into_and_removes_read_only_trees(tmp: Path) -> None:
    """Go's module cache is 0555; a tool may leave a 000 directory: folding keeps their modes,
    removing works, and neither needs root."""
    upper, layer, trash = tmp / "upper", tmp / "layer", tmp / "trash"
    make(layer, {"mod/m@v1/a": "file:a"})
    make(upper, {"mod/m@v1/b": "file:b", "mod/new@v2/c": "file:c", "zero/z": "file:z"})
    for p in (layer / "mod/m@v1", upper / "mod/m@v1", upper / "mod/new@v2"):
        p.chmod(0o555)
    (upper / "zero").chmod(0)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(tmp)], check=True)
    trash.mkdir()
    os.chown(trash, NOBODY, NOBODY)

    def fold_then_remove() -> None:
        assert layermerge.merge(upper, layer, trash) == []
        assert sorted(os.listdir(layer / "mod/m@v1")) == ["a", "b"]
        assert stat.S_IMODE(os.lstat(layer / "mod/m@v1").st_mode) == 0o555
        assert stat.S_IMODE(os.lstat(layer / "mod/new@v2").st_mode) == 0o555
        assert stat.S_IMODE(os.lstat(layer / "zero").st_mode) == 0
        layermerge.force_rmtree(layer)
        layermerge.force_rmtree(upper)
        assert not layer.exists() and not upper.exists()

    as_nobody(fold_then_remove)


def test_a_run_is_live_while_any_process_holding_its_lock_lives(tmp: Path) -> None:
    ws = tmp / "ws"
    with layerstore.locked(ws, owner=os.geteuid()):
        run, fd = layerstore.new_run(ws, "/somewhere", fresh=False)
    child = os.fork()  # inherits the lock, as the sandbox's holder and init do
    if child == 0:
        r, _ = os.pipe()
        os.read(r, 1)  # block until killed
        os._exit(0)
    try:
        os.close(fd)  # the launcher is done; its sandbox is not
        with layerstore.locked(ws, owner=None):
            live, dead = layerstore.runs(ws)
        assert [r.path for r in live] == [run] and live[0].workspace == "/somewhere" and not dead
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    with layerstore.locked(ws, owner=None):
        live, dead = layerstore.runs(ws)
    assert not live and [r.path for r in dead] == [run]


def test_a_workspace_made_again_at_the_same_path_is_another_workspace(tmp: Path) -> None:
    ws = tmp / "proj"
    ws.mkdir()
    first = layerstore.workspace_dir(tmp / "home", str(ws))
    assert layerstore.workspace_dir(tmp / "home", str(ws)) == first
    ws.rmdir()
    ws.mkdir()  # ext4 hands out the same inode number again at once: the generation differs
    second = layerstore.workspace_dir(tmp / "home", str(ws))
    assert second[1] == first[1] and second[0] != first[0]


def test_cache_clear_names_the_live_runs_and_removes_nothing(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layerstore, "ROOT_BASE", tmp / "lib")
    home, ws = tmp / "home", tmp / "home" / "proj"
    ws.mkdir(parents=True)
    ov = homeoverlay.plan(str(home), (), uid=4242, owner=0, workspace=str(ws))
    assert ov is not None and len(ov.layers) == 1
    with pytest.raises(homeoverlay.LayersBusy) as busy:
        homeoverlay.clear(4242, 0)
    assert [r.pid for r in busy.value.live] == [os.getpid()] and str(ws) in str(busy.value)
    assert Path(ov.layers[0]).is_dir()
    os.close(ov.hold)  # the run ended
    assert homeoverlay.clear(4242, 0) == 1
    assert not Path(ov.layers[0]).exists() and not Path(ov.upper).exists()

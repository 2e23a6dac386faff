"""r2-user U1: git in the sandbox refused the user's repository ("detected dubious ownership").

The fake `git` below enforces git's documented owner check (git-config `safe.directory`: "Git-tracked
directories that are considered safe even if they are owned by someone other than the current user
... only respected in protected configuration", https://git-scm.com/docs/git-config; Git for Windows
compares the NTFS owner): a repository whose `.git` or top folder another user owns is refused with
exit 128 unless the command scope (GIT_CONFIG_COUNT/KEY_n/VALUE_n) names its top. Fake evidence only.
"""

from __future__ import annotations

import ntpath
from typing import Any

import pytest

from fsguard.windows import gitenv
from fsguard.windows.launch import Launch
from launcher import cli
from tests.support import winfake
from tests.support.winfake import REAL_SID, WS, FakeWinApi

GIT = r"C:\Tools\git.exe"
DUBIOUS, NOT_A_REPO = 128, 129  # git dies with 128 either way; told apart here


def fake_git(api: FakeWinApi, launch: Launch, desk: str) -> int:
    user = api.m.users[launch.user][0]
    top = launch.cwd
    while not api.exists(ntpath.join(top, ".git")):
        if ntpath.dirname(top) == top:
            return NOT_A_REPO
        top = ntpath.dirname(top)
    owners = {api.m.owners.get(p, REAL_SID) for p in (top, ntpath.join(top, ".git"))}
    if owners == {user}:
        return 0
    env = {k.upper(): v for k, v in launch.env.items()}
    keys = range(int(env.get("GIT_CONFIG_COUNT", "0")))
    safe = {env[f"GIT_CONFIG_VALUE_{i}"] for i in keys if env[f"GIT_CONFIG_KEY_{i}"].lower() == "safe.directory"}
    return 0 if top.replace("\\", "/") in safe else DUBIOUS


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeWinApi:
    fake = winfake.installed(monkeypatch)
    fake.m.files[GIT] = b"MZ"
    fake.program = fake_git
    return fake


def _env(api: FakeWinApi) -> dict[str, str]:
    ((launch, _),) = api.launches.values()
    return dict(launch.env)


def test_git_status_in_the_users_repository_runs(api: FakeWinApi) -> None:
    assert cli.main(["run", "--", "git", "status"]) == 0
    env = _env(api)
    assert (env["GIT_CONFIG_COUNT"], env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"]) == (
        "1",
        "safe.directory",
        "C:/src/proj",
    )


def test_the_control_without_safe_directory_git_refuses(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gitenv, "with_safe_directories", lambda env, dirs: dict(env))
    assert cli.main(["run", "--", "git", "status"]) == DUBIOUS


def _cwd(api: FakeWinApi, monkeypatch: pytest.MonkeyPatch, cwd: str) -> None:
    api.m.dirs.add(cwd)
    api.m.dacls[cwd] = winfake.BASE_DACL
    monkeypatch.setattr(api, "cwd", lambda: cwd)


def test_a_subfolder_of_the_users_repository_trusts_the_repository_too(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cwd(api, monkeypatch, WS + r"\pkg")
    assert cli.main(["run", "--", "git", "status"]) == 0
    env = _env(api)
    assert [env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))] == [
        "C:/src/proj/pkg",
        "C:/src/proj",
    ]


def test_a_git_directory_another_account_planted_above_is_never_trusted(
    api: FakeWinApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = r"C:\.git"
    api.m.dirs.add(planted)
    api.m.dacls[planted] = winfake.BASE_DACL
    api.m.owners[planted] = "S-1-5-21-9-9-9-1005"  # another local user
    _cwd(api, monkeypatch, r"C:\scratch")
    assert cli.main(["run", "--", "git", "status"]) == DUBIOUS  # git's own refusal stands
    env = _env(api)
    assert [env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))] == ["C:/scratch"]


def test_a_count_the_env_filter_left_without_its_keys_is_renumbered_not_kept(api: FakeWinApi) -> None:
    """The env filter drops GIT_CONFIG_KEY_<n> (a secret-looking name) and keeps the count: passed on,
    git would die on the missing key; only whole pairs are kept, ours renumbered after them."""
    api.env |= {"git_config_count": "1", "GIT_CONFIG_KEY_0": "core.autocrlf", "GIT_CONFIG_VALUE_0": "false"}
    assert cli.main(["run", "--", "git", "status"]) == 0
    env = _env(api)
    assert {k: v for k, v in env.items() if k.startswith("GIT_CONFIG")} == {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "C:/src/proj",
    }


@pytest.mark.parametrize(
    ("given", "dirs", "want"),
    [
        (
            {},
            (r"C:\src\proj",),
            {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "C:/src/proj"},
        ),
        (
            {
                "git_config_count": " 2 ",
                "GIT_CONFIG_KEY_0": "a.b",
                "GIT_CONFIG_VALUE_0": "1",
                "GIT_CONFIG_VALUE_1": "2",
            },
            ("D:\\",),
            {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "1"}
            | {"GIT_CONFIG_KEY_1": "safe.directory", "GIT_CONFIG_VALUE_1": "D:/"},
        ),
        (
            {},
            (r"C:\a", "C:/a"),
            {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "C:/a"},
        ),
    ],
)
def test_with_safe_directories(given: dict[str, str], dirs: tuple[str, ...], want: dict[str, Any]) -> None:
    assert gitenv.with_safe_directories({"PATH": "C:\\x"} | given, dirs) == {"PATH": "C:\\x"} | want

"""r3-new N5: only the names git reads are GIT_CONFIG entries.

git reads exactly `GIT_CONFIG_KEY_%d` / `GIT_CONFIG_VALUE_%d` for 0 <= i < GIT_CONFIG_COUNT (config.c,
git_config_from_parameters), so `GIT_CONFIG_KEY_01` is ignored outside the sandbox; renumbered inside it
would become a live entry, and shadow the real `_1`.
"""

from __future__ import annotations

from fsguard.windows import gitenv


def test_a_leading_zero_name_is_no_entry_and_does_not_shadow_the_real_one() -> None:
    env = {
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": "core.autocrlf",
        "GIT_CONFIG_VALUE_0": "true",
        "GIT_CONFIG_KEY_1": "user.name",
        "GIT_CONFIG_VALUE_1": "me",
        "GIT_CONFIG_KEY_01": "core.fsmonitor",  # git never reads this one
        "GIT_CONFIG_VALUE_01": "evil.exe",
    }
    out = gitenv.with_safe_directories(env, ("C:\\src\\proj",))
    live = [(out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"]) for i in range(int(out["GIT_CONFIG_COUNT"]))]
    assert live == [("core.autocrlf", "true"), ("user.name", "me"), ("safe.directory", "C:/src/proj")]


def test_a_count_of_non_ascii_digits_is_no_count_not_a_crash() -> None:
    out = gitenv.with_safe_directories({"GIT_CONFIG_COUNT": "\u00b2"}, ("C:\\p",))
    assert (out["GIT_CONFIG_COUNT"], out["GIT_CONFIG_KEY_0"], out["GIT_CONFIG_VALUE_0"]) == (
        "1",
        "safe.directory",
        "C:/p",
    )

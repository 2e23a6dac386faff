"""launcher.audit.bydesign: a failed command's likely refusals by design, one hint per kind."""

from __future__ import annotations

from launcher.audit import bydesign
from launcher.audit.bydesign import Facts
from netguard import audit
from netguard.audit import PolicyRecord

WS = "/work/ws"


def policy(**kw: object) -> PolicyRecord:
    base: dict[str, object] = dict(
        write=[WS, "/tmp"], private_tmp=True, protect=[f"{WS}/.git/config", f"{WS}/.git/hooks", f"{WS}/.vscode"],
        hidden=["/home/u/.ssh", "/home/u/.aws"], env_dropped=[], landlock_abi=4, warnings=[],
    )  # fmt: skip
    base.update(kw)
    return audit.policy_record("t", **base)  # type: ignore[arg-type]


def facts(*argv: str, status: int = 1, root: bool = False) -> Facts:
    return Facts(tuple(argv), WS, "/home/u", status, root)


def hints(f: Facts, p: PolicyRecord | None = None, exists: bool = True) -> list[str]:
    return bydesign.hints(f, p or policy(), lambda _: exists)


def test_git_config_names_git_protection_and_reading_git_config_does_not() -> None:
    (line,) = hints(facts("git", "config", "x.y", "z"))
    assert line.startswith("sandgate: hint: git's config, hooks") and "Device or resource busy" in line
    assert "docs/git-protection.md" in line
    assert hints(facts("git", "config", "--get", "x.y")) == []
    assert hints(facts("git", "-C", "sub", "commit", "-m", "x")) == []  # an everyday git command
    assert len(hints(facts("sh", "-c", "cd sub && git push -u origin main"))) == 1
    assert len(hints(facts("git", "-c", "a=b", "remote", "add", "o", "u"))) == 1
    assert hints(facts("git", "config", "x.y", "z"), policy(protect=[f"{WS}/.vscode"])) == []  # no repo protected


def test_nothing_when_the_command_succeeded_or_there_is_no_record() -> None:
    assert hints(facts("git", "config", "x.y", "z", status=0)) == []
    assert bydesign.hints(facts("git", "config", "x.y", "z"), None, lambda _: True) == []


def test_a_protected_and_a_hidden_path_named_on_the_command_line() -> None:
    (line,) = hints(facts("sh", "-c", "echo {} > .vscode/settings.json"))
    assert f"{WS}/.vscode/settings.json is read-only inside" in line
    (line,) = hints(facts("cat", "~/.ssh/id_ed25519"))
    assert "/home/u/.ssh/id_ed25519 is hidden inside" in line


def test_the_host_tmp_only_when_the_file_exists_on_the_host() -> None:
    (line,) = hints(facts("python", "/tmp/venv/bin/tool"))
    assert "/tmp/venv/bin/tool is on the host's /tmp" in line and "--write /tmp/venv/bin/tool" in line
    assert hints(facts("python", "/tmp/venv/bin/tool"), exists=False) == []  # made in the sandbox's own /tmp
    assert hints(facts("cat", f"{WS}/x", "--out=/tmp/ws2/y"), policy(write=[WS, "/tmp", "/tmp/ws2"])) == []


def test_command_not_found_after_a_path_warning() -> None:
    warned = policy(warnings=["PATH entry /tmp/v/bin is not visible inside: the sandbox has its own private /tmp; x"])
    (line,) = hints(facts("tool", status=127), warned)
    assert "a PATH entry under the host's /tmp" in line
    assert hints(facts("tool", status=1), warned) == []  # not "command not found"


def test_system_package_managers_and_sudo() -> None:
    (line,) = hints(facts("apt-get", "install", "-y", "jq", root=True))
    assert "apt-get needs the host's root" in line and "user namespace's root" in line and "are you root?" in line
    (line,) = hints(facts("sh", "-c", "sudo make install"))
    assert "sudo needs the host's root" in line and "setuid" in line


def test_words_split_a_shell_script_and_survive_a_bad_quote() -> None:
    assert bydesign.words(["sh", "-c", "a && git config x >f"]) == [
        "sh",
        "-c",
        "a",
        "&&",
        "git",
        "config",
        "x",
        ">",
        "f",
    ]
    assert bydesign.words(["sh", "-c", "echo 'open"]) == ["sh", "-c", "echo", "'open"]

"""`sandgate verify --only`: groups and probe names, one parser, and what the runner is told."""

from __future__ import annotations

import pytest

from selftest.hostrows import HOST_ROWS, UNTRUSTED
from selftest.probes.core import GROUPS, REGISTRY, select_probes
from selftest.selection import Selection, parse_only


def test_nothing_given_selects_every_row_and_tells_the_runner_nothing() -> None:
    sel = parse_only(None)
    assert sel == Selection() and sel.runner_only() == ()
    assert all(sel.wants(p.group, p.name) for p in REGISTRY.values())
    assert sel.wants("process", "daemon_after_run") and sel.wants("filesystem", UNTRUSTED)


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_selects_its_probes_and_host_rows_only(group: str) -> None:
    sel = parse_only(group)
    assert {p.name for p in REGISTRY.values() if sel.wants(p.group, p.name)} == {
        p.name for p in REGISTRY.values() if p.group == group
    }
    assert {n for n, g in HOST_ROWS.items() if sel.wants(g, n)} == {n for n, g in HOST_ROWS.items() if g == group}
    assert sel.runner_only() == (group,)


def test_probe_names_and_groups_mix_comma_separated_with_spaces_ignored() -> None:
    sel = parse_only(" git_hooks, rename_protected ,process")
    assert sel.names == {"git_hooks", "rename_protected", "process"}
    assert sel.wants("filesystem", "git_hooks") and not sel.wants("filesystem", "git_config")
    assert sel.wants("process", "ptrace_outside")
    # what the runner runs is exactly the selection, in every context that has them
    ran = {p.name for p in select_probes("child", sel.runner_only())}
    assert ran == {"git_hooks", "rename_protected"} | {p.name for p in REGISTRY.values() if p.group == "process"}


def test_only_host_rows_still_run_the_runner_in_their_group() -> None:
    sel = parse_only("daemon_after_run")
    assert sel.runner_only() == ("process",)  # the daemon row needs the runner's setsid daemon
    assert sel.wants("process", "daemon_after_run") and not sel.wants("process", "ptrace_outside")


@pytest.mark.parametrize("text", ["", " , ", "bogus", "network,git_hookz", "NETWORK"])
def test_unknown_or_empty_names_are_refused_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match="--only") as e:
        parse_only(text)
    for name in (n.strip() for n in text.split(",") if n.strip() and n.strip() != "network"):
        assert name in str(e.value)

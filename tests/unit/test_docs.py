"""The README is one page that links to docs/, every link lands, and the reference it once held is in docs/.

Issue 26: the README was 85 KB; the reference moved to docs/ (moved, not dropped: a sentence of
every former README section must still be found there). The README's two commands are the ones
`.ci/run` runs and the ones `.ci/setup` knows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")

#: One sentence of each section of the old README (as of issue 25) that must live on in docs/.
FORMER_SECTIONS = {
    "What it does": "Nothing of a sandbox exists in the host's namespaces",
    "What it does (files)": "**Protected paths** stay read-only even inside writable ones",
    "Exit status": "**125** for sandgate's own errors",
    "Who the command is": "An ordinary user cannot run the command as someone else",
    "What it needs": "`libnftables` (Debian/Ubuntu package `nftables`)",
    "Installing for a user without root": "**apt as an unprivileged user.**",
    "Commands": "**Only a launcher outside every sandbox may use a daemon.**",
    "Fair share": "npm (15-50 sockets), pip, cargo (~100)",
    "Policy format": "Limits that hold in every policy, trusted or not",
    "Request rules and credentials": "- **One spelling of a path.**",
    "Egress audit log": "`packet` records are one per (destination, protocol, port)",
    "Code map": "Where each mechanism lives (one module, one mechanism",
    "From a real run to a policy": "Nobody writes a good allowlist from memory",
    "Approvals": "The sandbox cannot answer its own questions",
    "What the boundary covers": "The shared daemon's rows (the command itself only) bring company",
    "Known gaps": "Known gaps",
    "Other limits": "Raw TCP to a name (e.g. `git@github.com:22`) is decided by IP only",
}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if dest.suffix != ".md":
            continue
        if not dest.is_file() or (anchor and anchor not in _anchors(dest)):
            broken.append(target)
    return broken


def test_readme_is_a_page() -> None:
    assert len(README.read_bytes()) <= 16 * 1024


def test_every_docs_link_of_the_readme_resolves() -> None:
    linked = {t.partition("#")[0] for t in LINK.findall(README.read_text()) if t.startswith("docs/")}
    assert {"docs/install.md", "docs/ci.md", "docs/agents.md", "docs/audit.md", "docs/policy.md"} <= linked
    assert _broken_links(README) == []


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_link_between_docs_pages_resolves(page: Path) -> None:
    assert _broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    assert {p.resolve() for p in DOCS.glob("*.md")} - linked == set()


@pytest.mark.parametrize(("section", "sentence"), FORMER_SECTIONS.items(), ids=list(FORMER_SECTIONS))
def test_the_former_readme_reference_lives_on_in_docs(section: str, sentence: str) -> None:
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    assert sentence in docs, f"README section {section!r} lost in the move to docs/"


def test_the_readme_commands_are_what_setup_and_ci_run() -> None:
    commands = [line for line in README.read_text().splitlines() if line.startswith(".ci/setup")]
    assert len(commands) == 2, commands
    runtime, tests = commands
    assert runtime.startswith(".ci/setup && ") and "--test" not in runtime  # command 1: runtime only
    assert tests == ".ci/setup --test && .venv/bin/python -m tests"
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()  # CI runs exactly command 2

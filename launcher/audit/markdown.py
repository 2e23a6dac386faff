"""`sandgate audit summary --markdown`: the summary as Markdown, for a CI job's summary page.

GitHub renders `$GITHUB_STEP_SUMMARY` as Markdown with some HTML (the sandgate action writes this
there). Pure: rows in, text out. Everything the log holds was chosen by the sandboxed command (host
names, paths, reasons), so every logged string is escaped for the terminal first (launcher.audit.text)
and then every character Markdown or HTML would read becomes an entity: a host name must not be
able to add a link, an image, a table cell or markup to the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from launcher.audit import refusals, summary
from launcher.audit.text import escape
from netguard import rules

#: Characters Markdown (tables, emphasis, links, code, headings, HTML) or HTML entities give meaning; `.`,
#: `:` and `@` too, or GitHub would turn a logged `www.x.test` or `a@b.test` into a link.
_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~&\"'=:@$")
HEADER = ("status", "destination", "count", "up", "down", "rules", "reason")


def cell(text: str) -> str:
    """Logged text as inert Markdown: terminal-escaped, then every special character a numeric entity."""
    return "".join(f"&#{ord(ch)};" if ch in _SPECIAL else ch for ch in escape(text))


def _status(d: summary.Destination) -> str:
    if d.risk < 0:
        return "**attempted leak**"
    return {0: "**denied**", 1: "would deny (learn)"}.get(d.risk, "allowed")


def _row(d: summary.Destination, bundled: Mapping[str, rules.Ruleset]) -> str:
    label = d.label + (" (dns)" if d.dns else "")
    cells = (
        _status(d),
        cell(label),
        str(d.count),
        "-" if d.dns else str(d.bytes_up),
        "-" if d.dns else str(d.bytes_down),
        cell(", ".join(sorted(d.rules))) or "-",
        cell(summary.reason(d, bundled) or "") or "-",
    )
    return "| " + " | ".join(cells) + " |"


def _refused(found: Sequence[refusals.Refused]) -> list[str]:
    """Attempted leaks, then refused requests (an inspected host's rules said no), one bullet each."""
    out = []
    for x in found:
        what = f"attempted leak of ${x.leak}: " if x.leak is not None else "refused: "
        times = f" ({x.count}x)" if x.count > 1 else ""
        out.append(f"- {cell(what + x.where() + times + ': ' + x.reason)}")
    return out


def format_markdown(rows: Sequence[summary.Destination], bundled: Mapping[str, rules.Ruleset] | None = None) -> str:
    """A heading with the counts, the destination table (riskiest first), then refused requests."""
    denied = sum(d.risk <= 0 for d in rows)
    learned = sum(d.risk == 1 for d in rows)
    head = f"### sandgate: {len(rows)} destination{'' if len(rows) == 1 else 's'}, {denied} denied"
    head += f", {learned} allowed only by --learn" if learned else ""
    if not rows:
        return head + "\n\nThe command made no connection and no lookup.\n"
    lines = [head, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [_row(d, bundled or {}) for d in rows]
    found = [x for d in rows for x in d.refused]
    if found:
        lines += ["", "Refused requests:", "", *_refused(found)]
    return "\n".join(lines) + "\n"

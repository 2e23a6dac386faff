"""`sandgate audit summary --markdown` (launcher.audit.markdown): a CI job summary that logged text cannot mark up."""

from __future__ import annotations

from pathlib import Path

from launcher.audit import markdown
from launcher.audit.logs import read_logs
from launcher.audit.summary import summarize

from ..support.audit_records import dec, real_bundled, two_runs


def test_the_summary_as_markdown_names_denials_first_with_what_would_allow_them(tmp_path: Path) -> None:
    rows = summarize(read_logs(list(two_runs(tmp_path))))
    page = markdown.format_markdown(rows, real_bundled("pypi"))
    lines = page.splitlines()
    assert lines[0] == "### sandgate: 6 destinations, 2 denied, 1 allowed only by --learn"
    assert lines[2] == "| status | destination | count | up | down | rules | reason |"
    assert lines[4].startswith("| **denied** | evil&#46;test&#58;443 | 3 |")
    assert "would deny (learn)" in lines[6]
    pypi = next(line for line in lines if "| pypi&#46;org&#58;443 |" in line)
    assert pypi == "| allowed | pypi&#46;org&#58;443 | 3 | 101 | 2002 | policy&#46;yaml&#58;3 | - |"


def test_logged_text_cannot_add_markup_links_or_cells() -> None:
    """The sandboxed command chose these names: nothing of them may become a link, an image or a cell."""
    hostile = "www.x.test/<img src=x onerror=alert(1)>|[a](http://e.test)`*_\n# h"
    rows = summarize([dec("t", hostile, 443, "deny")])
    page = markdown.format_markdown(rows)
    table_row = page.splitlines()[4]
    assert table_row.count("|") == 8  # seven cells: none added by the name
    for raw in ("<", ">", "[", "](", "`", "*_", "www.", "http:", "\n#"):
        assert raw not in table_row.removeprefix("| **denied** |"), raw
    assert markdown.cell("a.b") == "a&#46;b" and markdown.cell("\x1b[31m") == "&#92;x1b&#91;31m"


def test_an_empty_log_says_so() -> None:
    assert markdown.format_markdown([]) == (
        "### sandgate: 0 destinations, 0 denied\n\nThe command made no connection and no lookup.\n"
    )

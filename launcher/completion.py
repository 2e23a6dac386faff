"""`sandgate completion bash|zsh|fish`: a completion script, generated from the parser itself by shtab.

Generated, not hand-written: every option and subcommand `sandgate --help` knows is completed, and
a new one needs no edit here. What the parser cannot say is added on its actions before shtab reads
them: `--allow` completes the bundled list names (fixed in the script when it is generated: a tab
never starts Python), and the options that name files complete file names.
"""

from __future__ import annotations

import argparse
from typing import Any

FILE_OPTIONS = ("policy", "audit_log", "upstream_ca", "write", "read_deny", "expose_socket", "ca_cert", "logs", "file")
_FUNCTION = "_sandgate_allowlists"


def allowlist_completion(names: list[str]) -> dict[str, Any]:
    """shtab's `.complete` value: the bundled names for bash (a compgen function), zsh and fish (word lists)."""
    words = " ".join(names)
    return {
        "bash": _FUNCTION,
        "zsh": f"({words})",
        "fish": f"({_FUNCTION})",
        "preamble": {
            "bash": f'\n{_FUNCTION}() {{\n  compgen -W "{words}" -- "$1"\n}}\n',
            "fish": f"\nfunction {_FUNCTION}\n  printf '%s\\n' {words}\nend\n",
        },
    }


def _annotate(parser: argparse.ArgumentParser, allow: dict[str, Any], files: Any) -> None:
    """Set shtab's `.complete` on --allow and the file options of `parser` and of every subcommand's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _annotate(sub, allow, files)
        elif action.dest == "allow":
            action.complete = allow  # type: ignore[attr-defined]  # shtab reads this attribute
        elif action.dest in FILE_OPTIONS:
            action.complete = files  # type: ignore[attr-defined]


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for `shell` (one of shtab's: bash, zsh, fish) from `parser`, sandgate's whole
    parser (launcher/cli.py builds it and passes it in: this module never imports the CLI)."""
    import shtab

    from launcher.config.bundled import bundled_names

    _annotate(parser, allowlist_completion(bundled_names()), shtab.FILE)
    text: str = shtab.complete(parser, shell)
    return text


def main(shell: str, parser: argparse.ArgumentParser) -> int:
    print(script(shell, parser), end="")
    return 0

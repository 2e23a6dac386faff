"""The "always allow" answer: one allow entry added to the user's policy file as a minimal text edit.

Pure: policy text in, policy text out. The YAML is never re-dumped, so comments, key order,
quoting and indentation survive. The file is composed (yaml.compose, with node marks) only to
find where `network.allow` lives; the edit itself inserts or rewrites single lines:

- `allow:` block sequence: a new `- ENTRY` line after the last line of the last item's content,
  at the indentation of the existing dashes (comments and blank lines after it stay after it);
- `allow: [..]` flow sequence on one line: the entry joins the brackets, the rest of the line
  (a trailing comment) is kept;
- `network:` block mapping without `allow`: `allow:` and `- ENTRY` become its first key;
- no `network` key: `network: / allow: / - ENTRY` is appended at the end of the file.

Any other shape (flow `network: {..}`, anchors, aliases, tags or merge keys on the way, several
documents, a multi-line flow list, an `allow` that is not a list, tabs, odd line breaks, invalid
YAML) gives None, and so does any edit whose result does not parse to exactly the old document
plus the one entry: the caller then prints allow_entry() for the user to add by hand. A policy is
never written broken or changed in any other way.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode, SequenceNode

from netguard import policy as netpolicy
from sgbase.policyerror import PolicyError

__all__ = ["add_allow", "allow_entry"]

_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
# Characters PyYAML counts as line breaks (besides \n and \r\n) or skips when counting columns;
# with any of them the node marks and our lines would disagree. Tabs: indentation we cannot copy.
_AWKWARD = ("\x85", "\u2028", "\u2029", "\ufeff", "\t")


class _Unsafe(Exception):
    """The file has a shape that a line edit cannot amend safely."""


class _Composer(yaml.SafeLoader):
    """SafeLoader's composer, remembering the nodes that carry an anchor or an explicit tag (or are aliased)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.marked: set[int] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in PyYAML's stubs
        node = super().compose_node(parent, index)
        if isinstance(event, AliasEvent) or event.anchor is not None or getattr(event, "tag", None) is not None:
            self.marked.add(id(node))  # every node stays referenced by the tree, so ids stay unique
        return node


def allow_entry(host: str, port: int) -> str:
    """The YAML flow text of one allow entry: '{host: "example.org", ports: [443]}' (always with ports, quoted host).

    Raises ValueError for a port outside 1..65535 or a host the policy loader would refuse
    (`*`, bad labels, CIDR ranges, control characters).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"invalid port {port!r}: ports are whole numbers from 1 to 65535")
    if not isinstance(host, str) or not host or "/" in host or not host.isprintable():
        raise ValueError(f"invalid host {host!r}")
    _rule(host, port)
    quoted = host.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{host: "{quoted}", ports: [{port}]}}'


def add_allow(text: str, host: str, port: int) -> str | None:
    """`text` with one allow entry appended to network.allow, or None if that cannot be done by a safe text edit.

    `text` itself is returned when an allow entry for the same host already covers `port`.
    Raises ValueError (from allow_entry) for an invalid host or port.
    """
    entry = allow_entry(host, port)
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    body = text[len(bom) :]
    try:
        old = yaml.safe_load(text)
        if not isinstance(old, dict):
            return None
        if _already_allowed(old, host, port):
            return text
        nl = _line_break(body)
        loader = _Composer(body)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
        new = bom + _edit(body, nl, root, loader.marked, entry)
    except (yaml.YAMLError, RecursionError, _Unsafe):
        return None
    return new if _is_old_plus(old, new, {"host": host, "ports": [port]}) else None


# ---- the edits --------------------------------------------------------------------------


def _edit(body: str, nl: str, root: Node | None, marked: set[int], entry: str) -> str:
    if not isinstance(root, MappingNode) or root.flow_style or id(root) in marked:
        raise _Unsafe("the document is not a plain block mapping")
    lines = body.split(nl)
    found = _item(root, "network", marked)
    if found is None:
        return _append_network(body, nl, lines, root, entry)
    network_key, network = found
    if not isinstance(network, MappingNode) or network.flow_style:
        raise _Unsafe("'network' is not a block mapping")
    found = _item(network, "allow", marked)
    allow = found[1] if found else None
    if allow is None:
        # Right under `network:`, so comments above the old first key stay with it.
        col = _block_column(lines, network)
        at = network_key.end_mark.line + 1
        lines[at:at] = [" " * col + "allow:", " " * (col + 2) + "- " + entry]
    elif not isinstance(allow, SequenceNode):
        raise _Unsafe("'network.allow' is not a list")
    elif allow.flow_style:
        _extend_flow(lines, allow, marked, entry)
    else:
        col = _block_column(lines, allow)
        end = _content_end(allow.value[-1], marked)
        lines.insert(end.line + 1, " " * col + "- " + entry)
    return nl.join(lines)


def _append_network(body: str, nl: str, lines: list[str], root: MappingNode, entry: str) -> str:
    col = _block_column(lines, root)
    pad = " " * col
    added = [pad + "network:", pad + "  allow:", pad + "    - " + entry]
    sep = nl if body and not body.endswith(nl) else ""
    return body + sep + nl.join(added) + nl


def _extend_flow(lines: list[str], seq: SequenceNode, marked: set[int], entry: str) -> None:
    """`[a, b]` -> `[a, b, ENTRY]` on its one line; `[]` -> `[ENTRY]`."""
    start, end = seq.start_mark, seq.end_mark
    if start.line != end.line:
        raise _Unsafe("a flow list over several lines")
    line = lines[start.line]
    if line[start.column : start.column + 1] != "[" or line[end.column - 1 : end.column] != "]":
        raise _Unsafe("flow list marks do not point at its brackets")
    if seq.value:
        last = seq.value[-1]
        if id(last) in marked or last.end_mark.line != start.line:
            raise _Unsafe("the last item of the flow list is an anchor or alias")
        col = last.end_mark.column
        lines[start.line] = line[:col] + ", " + entry + line[col:]
    else:
        lines[start.line] = line[: start.column] + "[" + entry + "]" + line[end.column :]


def _block_column(lines: list[str], node: Node) -> int:
    """Column of a block collection's first key or dash, which must be the first thing on its line."""
    mark = node.start_mark
    if lines[mark.line][: mark.column].strip(" "):
        raise _Unsafe("a block collection that does not start its line")
    return mark.column


def _content_end(node: Node, marked: set[int]) -> yaml.Mark:
    """Where the text of `node` ends: the end of its last scalar or flow collection.

    Not the block collection's own end_mark, which lies at the next token (possibly after
    comments and blank lines that belong to nobody).
    """
    while True:
        if id(node) in marked:  # an alias's marks point at its anchor, elsewhere in the file
            raise _Unsafe("an anchor or alias at the end of the list")
        if isinstance(node, ScalarNode):
            if node.style in ("|", ">"):  # a block scalar's end_mark lies past its trailing line breaks
                raise _Unsafe("a block scalar at the end of the list")
            return node.end_mark
        if not isinstance(node, CollectionNode) or node.flow_style or not node.value:
            return node.end_mark
        last = node.value[-1]
        node = last[1] if isinstance(node, MappingNode) else last


def _item(mapping: MappingNode, name: str, marked: set[int]) -> tuple[Node, Node] | None:
    """The key and value nodes of key `name`; None when absent. Merge keys, duplicates, anchors and tags are unsafe."""
    found: list[tuple[Node, Node]] = []
    for knode, vnode in mapping.value:
        if knode.tag == _MERGE_TAG:
            raise _Unsafe("a merge key ('<<') where the entry would go")
        if isinstance(knode, ScalarNode) and knode.value == name and knode.tag == _STR_TAG:
            if id(knode) in marked or id(vnode) in marked:
                raise _Unsafe(f"an anchor, alias or tag on '{name}'")
            found.append((knode, vnode))
    if len(found) > 1:
        raise _Unsafe(f"duplicate key '{name}'")
    return found[0] if found else None


def _line_break(body: str) -> str:
    """The file's one line-break style ("\\n" or "\\r\\n"); mixed, bare "\\r" or Unicode breaks are unsafe."""
    if any(ch in body for ch in _AWKWARD):
        raise _Unsafe("tabs, a byte order mark inside the text or Unicode line breaks")
    if "\r" not in body:
        return "\n"
    rest = body.replace("\r\n", "")
    if "\r" in rest or "\n" in rest:
        raise _Unsafe("mixed line breaks")
    return "\r\n"


# ---- meaning ----------------------------------------------------------------------------


def _rule(host: str, port: int) -> netpolicy.Rule:
    try:
        return netpolicy.parse_entry({"host": host, "ports": [port]}, "amend", None, netpolicy.DEFAULT_ALLOW_PORTS)
    except PolicyError as e:
        raise ValueError(f"invalid host {host!r}: {e}") from None


def _already_allowed(doc: dict[Any, Any], host: str, port: int) -> bool:
    """Whether an allow entry of `doc` names the same destination (after normalisation) and covers `port`."""
    network = doc.get("network")
    entries = network.get("allow") if isinstance(network, dict) else None
    if not isinstance(entries, list):
        return False
    want = _rule(host, port)
    for e in entries:
        try:
            r = netpolicy.parse_entry(e, "amend", None, netpolicy.DEFAULT_ALLOW_PORTS)
        except (PolicyError, TypeError):
            continue
        if r.kind == want.kind and r.value == want.value and (r.ports is None or port in r.ports):
            return True
    return False


def _is_old_plus(old: dict[Any, Any], new_text: str, entry: dict[str, Any]) -> bool:
    """Whether `new_text` parses to `old` with exactly `entry` appended to network.allow."""
    expected = copy.deepcopy(old)
    network = expected.setdefault("network", {})
    if not isinstance(network, dict):
        return False
    allow = network.setdefault("allow", [])
    if not isinstance(allow, list):
        return False
    allow.append(entry)
    try:
        new = yaml.safe_load(new_text)
        return type(new) is dict and new == expected
    except (yaml.YAMLError, RecursionError):
        return False

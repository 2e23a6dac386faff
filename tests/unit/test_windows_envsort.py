"""The environment block's order (issue 28, M3): Windows compares names as upper-cased UTF-16 code
units (https://learn.microsoft.com/en-us/windows/win32/procthread/changing-environment-variables:
"case-insensitive, Unicode order, without regard to locale"), not as Python's casefold()."""

from __future__ import annotations

from fsguard.windows import envblock


def _names(block: str) -> list[str]:
    return [e.split("=", 1)[0] for e in block.split("\0") if e]


def _windows_order(names: list[str]) -> list[str]:
    """An independent model: RtlCompareUnicodeString(CaseInSensitive) upcases each UTF-16 unit."""

    def units(n: str) -> list[int]:
        b = n.encode("utf-16-le", "surrogatepass")
        us = [int.from_bytes(b[i : i + 2], "little") for i in range(0, len(b), 2)]
        return [u - 32 if 0x61 <= u <= 0x7A else u for u in us]  # ASCII is all these names need

    return sorted(names, key=units)


def test_underscore_sorts_after_letters_as_windows_upcases() -> None:
    env = {"HTTP_PROXY": "a", "HTTPS_PROXY": "b", "no_proxy": "", "NODE": "x", "A_B": "1", "ab": "2"}
    got = _names(envblock.build(env))
    assert got == _windows_order(list(env)) == ["ab", "A_B", "HTTPS_PROXY", "HTTP_PROXY", "NODE", "no_proxy"]
    assert got.index("HTTPS_PROXY") < got.index("HTTP_PROXY")  # 'S' (0x53) < '_' (0x5F)
    assert got.index("ab") < got.index("A_B")  # 'B' (0x42) < '_' (0x5F); casefold() said the opposite
    assert got.index("NODE") < got.index("no_proxy")


def test_utf16_code_unit_order_for_names_outside_the_bmp() -> None:
    """A surrogate pair (0xD83D...) sorts below U+FFFD in UTF-16, though above it by code point."""
    got = _names(envblock.build({"X\ufffd": "1", "X\U0001f600": "2"}))
    assert got == ["X\U0001f600", "X\ufffd"]


def test_sort_key_upcases_per_unit_and_keeps_multi_letter_uppercases_as_they_are() -> None:
    assert envblock.sort_key("abc") == envblock.sort_key("ABC")
    assert envblock.sort_key("ß") == (0xDF,)  # "SS" is two letters: RtlUpcaseUnicodeChar keeps ß

"""netguard.decision.trim: a burst of connection closes is one malloc_trim, a short delay later."""

from __future__ import annotations

import asyncio

import pytest

from netguard.decision import trim


def test_a_burst_of_closes_is_one_trim_and_a_later_close_another(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(trim, "trim", lambda: calls.append(1))

    async def main() -> trim.Trimmer:
        t = trim.Trimmer(delay=0.05)
        for _ in range(1000):
            t.closed()
        assert calls == []  # not at once: the closes of a burst share one trim
        await asyncio.sleep(0.15)
        assert calls == [1]
        t.closed()
        await asyncio.sleep(0.15)
        return t

    t = asyncio.run(main())
    assert calls == [1, 1] and t.trims == 2


def test_trim_runs_on_this_libc() -> None:
    trim.trim()  # glibc's malloc_trim, or nothing where there is none: never raises

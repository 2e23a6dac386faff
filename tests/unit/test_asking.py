"""The proxy's side of approvals against a fake launcher: one question per destination, fail closed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from netguard.approval import Answer, Decision, Request, decode, encode
from netguard.asking import QUESTIONS, Approver


async def fake_launcher(
    path: Path, answer: Answer | None, seen: list[dict[str, object]], delay: float = 0.2, close_after: int | None = None
) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            q = json.loads(line)
            seen.append(q)
            assert isinstance(decode(line), Request)  # the daemon speaks the one protocol
            if close_after is not None and len(seen) >= close_after:
                writer.close()
                return
            if answer is not None:
                await asyncio.sleep(delay)
                writer.write(encode(Decision(q["id"], answer)))
                await writer.drain()

    return await asyncio.start_unix_server(handle, str(path))


def test_concurrent_asks_share_one_question_and_run_answers_are_remembered(tmp_path: Path) -> None:
    async def main() -> None:
        seen: list[dict[str, object]] = []
        server = await fake_launcher(tmp_path / "s", "run", seen)
        a = Approver(str(tmp_path / "s"), timeout=5)
        answers = await asyncio.gather(
            *(a.ask("x.test", 443, "connect", ("10.0.0.2", 5000 + i), "r") for i in range(5))
        )
        assert answers == ["run"] * 5 and len(seen) == 1 and seen[0]["peer"] == ["10.0.0.2", 5000]
        assert await a.ask("x.test", 443, "connect", None, "r") == "run" and len(seen) == 1  # remembered
        assert await a.ask("x.test", 8443, "connect", None, "r") == "run" and len(seen) == 2  # other port: asked
        server.close()

    asyncio.run(main())


def test_no_channel_no_answer_or_a_closed_channel_mean_deny(tmp_path: Path) -> None:
    async def main() -> None:
        assert await Approver(None, timeout=1).ask("x.test", 443, "connect", None, "r") == "deny"
        assert await Approver(str(tmp_path / "missing"), timeout=1).ask("x.test", 443, "connect", None, "r") == "deny"
        seen: list[dict[str, object]] = []
        silent = await fake_launcher(tmp_path / "silent", None, seen)
        assert await Approver(str(tmp_path / "silent"), timeout=0.2).ask("y.test", 443, "tls", None, "r") == "deny"
        closing = await fake_launcher(tmp_path / "closing", "once", [], close_after=1)
        assert await Approver(str(tmp_path / "closing"), timeout=5).ask("z.test", 443, "tls", None, "r") == "deny"
        once = await fake_launcher(tmp_path / "once", "once", [])
        a = Approver(str(tmp_path / "once"), timeout=5)
        assert await a.ask("w.test", 443, "tls", None, "r") == "once" and not a.for_run
        for s in (silent, closing, once):
            s.close()

    asyncio.run(main())


def test_a_malformed_answer_denies_its_question_at_once(tmp_path: Path) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            qid = json.loads(line)["id"]
            writer.write(b"not json\n")  # refused, and names no question: ignored
            writer.write((json.dumps({"type": "decision", "id": qid, "decision": "yes please"}) + "\n").encode())
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, str(tmp_path / "s"))
        a = Approver(str(tmp_path / "s"), timeout=30)
        answer = await asyncio.wait_for(a.ask("x.test", 443, "tls", None, "r"), 5)  # not after 30 s
        assert answer == "deny" and not a.for_run
        server.close()

    asyncio.run(main())


def test_a_flood_of_distinct_questions_asks_a_human_at_most_questions_at_once(tmp_path: Path) -> None:
    """Issue 22: 300 distinct hosts in under a second made 300 questions; now the rest are denied at once, said."""

    async def main() -> None:
        seen: list[dict[str, object]] = []
        refused: list[str] = []
        server = await fake_launcher(tmp_path / "s", "once", seen, delay=0.02)
        a = Approver(str(tmp_path / "s"), timeout=5, refused=refused.append)
        answers = await asyncio.gather(*(a.ask(f"h{i}.test", 443, "tls", None, "r") for i in range(300)))
        assert answers.count("once") == QUESTIONS and answers.count("deny") == 300 - QUESTIONS
        assert len(seen) == QUESTIONS and len(refused) == 300 - QUESTIONS
        assert refused[0] == f"more than {QUESTIONS} approval questions open at once"
        assert await a.ask("late.test", 443, "tls", None, "r") == "once"  # answered: room again
        server.close()

    asyncio.run(main())

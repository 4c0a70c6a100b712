"""Unit tests of consumers/ai_turns.py (a debounced lane) with pipeline.testing."""

from __future__ import annotations

import pytest

import consumers.ai_turns
from consumers.ai_turns import AiMessage, ModelRateLimited, app
from pipeline.testing import TestApp


class FakeModel:
    """Stands in for the hosted model: records prompts, answers 429 for the first ``fail`` calls."""

    def __init__(self, fail: int = 0) -> None:
        """Fail the first ``fail`` calls with ModelRateLimited."""
        self.prompts: list[str] = []
        self.fail = fail

    async def __call__(self, prompt: str) -> str:
        """Record the prompt and answer (or refuse)."""
        self.prompts.append(prompt)
        if len(self.prompts) <= self.fail:
            raise ModelRateLimited("429 Too Many Requests")
        return "ok"


def said(text: str, conversation: str = "conv-1") -> AiMessage:
    """A customer's message in ``conversation``."""
    return AiMessage(conversation_id=conversation, text=text)


async def test_a_burst_becomes_one_turn_after_the_quiet_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three messages a second apart make one turn, in order, 4 s after the last one."""
    model = FakeModel()
    monkeypatch.setattr(consumers.ai_turns, "call_model", model)
    async with TestApp(app) as t:
        for text in ("hi", "I ordered a lamp", "it arrived broken"):
            await t.send("ai_turns", said(text), key="conv-1", tenant="acme")
            await t.advance(1)
        await t.drain()
        (turn,) = t.runs("ai_turns")
        assert [e.text for e in turn.event] == ["hi", "I ordered a lamp", "it arrived broken"]
        assert turn.outcome == "handled"
        assert turn.started_s * 1000 >= turn.message.timestamp_ms + 4000  # the last one's
        assert model.prompts == ["hi\nI ordered a lamp\nit arrived broken"]
        assert t.dead_letters("ai_turns") == []


async def test_a_rate_limited_turn_runs_again_with_the_same_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 makes the turn run again, attempt 2, with the same burst; nothing is lost."""
    model = FakeModel(fail=1)
    monkeypatch.setattr(consumers.ai_turns, "call_model", model)
    async with TestApp(app) as t:
        await t.send("ai_turns", said("hello", "conv-2"), key="conv-2")
        await t.send("ai_turns", said("anyone there?", "conv-2"), key="conv-2")
        await t.drain()
        runs = t.runs("ai_turns")
        assert [(r.attempt, r.outcome) for r in runs] == [(1, "failed"), (2, "handled")]
        assert [e.text for e in runs[1].event] == ["hello", "anyone there?"]
        assert model.prompts == ["hello\nanyone there?"] * 2

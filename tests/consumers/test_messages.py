"""Unit tests of consumers/messages.py with pipeline.testing: no broker, no Redis, no waiting."""

from __future__ import annotations

from consumers.messages import MessageReceived, app
from pipeline.testing import TestApp


def received(conversation: str, text: str) -> MessageReceived:
    """An inbound message of ``conversation``."""
    return MessageReceived(conversation_id=conversation, text=text)


async def test_a_message_is_handled_once() -> None:
    """A good message runs once, on its first attempt, with its tenant, and nothing fails."""
    async with TestApp(app) as t:
        await t.send("messages", received("c1", "hi"), key="c1", tenant="acme", event_id="e1")
        await t.drain()
        (run,) = t.runs("messages")
        assert (run.outcome, run.attempt, run.tenant) == ("handled", 1, "acme")
        assert run.event == received("c1", "hi")
        assert run.context.event_id == "e1"
        assert t.retried("messages") == []
        assert t.dead_letters("messages") == []


async def test_a_rate_limited_message_climbs_the_tiers_then_is_dead_lettered() -> None:
    """Retry goes through 5s, then 1m, then 10m, never early, and ends in messages.dlq."""
    async with TestApp(app) as t:
        await t.send("messages", received("c2", "rate limited"), key="c2", tenant="acme")
        await t.drain()
        runs = t.runs("messages")
        assert [r.attempt for r in runs] == [1, 2, 3, 4]
        assert all(r.outcome == "failed" for r in runs)
        assert [m.topic for m in t.retried("messages")] == [
            "messages.retry.5s",
            "messages.retry.1m",
            "messages.retry.10m",
        ]
        for retry, run, tier_ms in zip(
            t.retried("messages"), runs[1:], (5_000, 60_000, 600_000), strict=True
        ):
            due_ms = int(retry.headers["pl-due-ms"])
            failed_ms = int(retry.headers["pl-last-failure-ms"])
            assert tier_ms / 2 <= due_ms - failed_ms <= tier_ms  # full jitter within the tier
            assert run.started_s * 1000 >= due_ms  # never early
        (dead,) = t.dead_letters("messages")
        assert (dead.reason, dead.attempts, dead.tenant) == ("exhausted", 4, "acme")
        assert dead.error_class == "pipeline.errors.Retry"
        assert dead.origin_topic == "messages"


async def test_later_messages_of_a_key_follow_it_to_the_dead_letter_topic() -> None:
    """A conversation's next message never overtakes a failing one: it is dead-lettered after it."""
    async with TestApp(app) as t:
        await t.send("messages", received("c3", "rate limited"), key="c3")
        await t.send("messages", received("c3", "thanks"), key="c3")
        await t.send("messages", received("c4", "other conversation"), key="c4")
        await t.drain()
        assert [r.event.text for r in t.runs("messages", lambda r: r.context.key == "c3")] == [
            "rate limited"
        ] * 4
        assert [r.outcome for r in t.runs("messages", lambda r: r.context.key == "c4")] == [
            "handled"
        ]
        dead = t.dead_letters("messages")
        assert [MessageReceived.model_validate_json(d.message.value).text for d in dead] == [
            "rate limited",
            "thanks",
        ]
        assert [d.reason for d in dead] == ["exhausted", "sequenced"]


async def test_an_empty_message_is_dead_lettered_at_once() -> None:
    """DeadLetter skips the tiers: one attempt, reason fatal, the error and origin in headers."""
    async with TestApp(app) as t:
        await t.send("messages", received("c5", "  "), key="c5", tenant="acme")
        await t.drain()
        assert [r.attempt for r in t.runs("messages")] == [1]
        assert t.retried("messages") == []
        (dead,) = t.dead_letters("messages")
        assert (dead.reason, dead.error_message, dead.tenant) == ("fatal", "empty message", "acme")
        assert dead.error_class == "pipeline.errors.DeadLetter"
        assert dead.message.key == b"c5"
        assert MessageReceived.model_validate_json(dead.message.value) == received("c5", "  ")

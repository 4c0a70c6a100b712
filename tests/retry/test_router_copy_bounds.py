"""What the router adds to a copy is bounded, so the copy fits the headroom its topics have.

The router produces through the in-memory producer, which applies the transports' own size check
(:func:`~pipeline.transport.limits.check_sizes`) and records what it sent; a dead-letter topic
made by hand with a small limit is that producer refusing the topic's records above it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import pytest

from pipeline import headers as h
from pipeline.envelope import Delivered, Message, Record
from pipeline.errors import DeadLetter, MessageTooLarge
from pipeline.retry.policy import Backoff
from pipeline.retry.router import (
    MAX_ERROR_BYTES,
    MAX_ERROR_CLASS_BYTES,
    ROUTED_HEADERS_BYTES,
    LaneRoutes,
    RetryRouter,
)
from pipeline.testing.memory.broker import MemoryBroker, Topic
from pipeline.testing.memory.producer import MemoryProducer
from pipeline.transport.limits import COPY_HEADROOM_BYTES, CopyHeaders, check_sizes

LIMIT = 1_114_112
ROUTES = LaneRoutes("m", ("m.retry.1s",), "m.dlq", 3, Backoff((1_000,)))


class CheckingProducer(MemoryProducer):
    """The in-memory producer (the transports' own size check) on topics ``m``, its tier and DLQ."""

    def __init__(self, refuse_above: Mapping[str, int] | None = None) -> None:
        """``refuse_above``: topics that refuse records larger than that (their own limit)."""
        broker = MemoryBroker()
        for topic in (ROUTES.topic, *ROUTES.retry_topics, ROUTES.dead_letter_topic):
            broker.topics[topic] = Topic(topic, [[]])
        super().__init__(broker, LIMIT)
        self.refuse_above = dict(refuse_above or {})

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Check the sizes, refuse what ``topic``'s own limit does, append the rest."""
        check_sizes(records, LIMIT)
        most = self.refuse_above.get(topic)
        if most is not None and any(r.size > most for r in records):
            raise MessageTooLarge(f"produce to {topic!r}: Broker: Message size too large")
        return await super().send_many(topic, records)


def near_limit(headers: dict[str, bytes] | None = None) -> Message:
    """A message of ``m`` whose key, value and ``headers`` take ``LIMIT - 100`` bytes."""
    headers = headers or {}
    used = 1 + sum(len(k) + len(v) for k, v in headers.items())
    return Message("m", 0, 7, b"k", b"v" * (LIMIT - 100 - used), headers, 1_700_000_000_000)


class Hostile(Exception):
    """An error whose text is megabytes of 4-byte characters."""

    def __str__(self) -> str:
        """Megabytes of emoji and a lone surrogate."""
        return "\ud800" + "\U0001f600" * 300_000


Hostile.__qualname__ = "Hostile" + "X" * 10_000


def test_the_router_adds_less_than_the_copy_headroom() -> None:
    """The bound on what the router writes, framing included, is within the headroom."""
    assert ROUTED_HEADERS_BYTES <= COPY_HEADROOM_BYTES


def test_only_a_copy_gets_the_headroom() -> None:
    """A record with plain headers is held to the limit; a copy's may exceed it by the headroom."""
    over = Record(b"v" * LIMIT, b"k", {"a": b"b"})
    with pytest.raises(MessageTooLarge, match=f"exceeds max_message_bytes={LIMIT}$"):
        check_sizes([over], LIMIT)
    check_sizes([Record(over.value, b"k", CopyHeaders({"a": b"b"}))], LIMIT)
    beyond = Record(b"v" * (LIMIT + COPY_HEADROOM_BYTES), b"k", CopyHeaders())
    with pytest.raises(MessageTooLarge, match="plus the 4096 bytes a copy may add"):
        check_sizes([beyond], LIMIT)


async def test_copies_of_a_message_near_the_limit_fit_whatever_the_error() -> None:
    """Retry and dead-letter copies, with a huge error text and class name, pass the check."""
    producer = CheckingProducer()
    router = RetryRouter(producer, lambda: 1_700_000_000_000)
    message = near_limit()
    await router.retry(ROUTES, message, 1, Hostile())
    await router.dead_letter(ROUTES, message, "fatal" * 1_000, Hostile())
    (_, retry, _), (_, dead, _) = producer.sent
    for copy in (retry, dead):
        assert copy.value == message.value
        assert copy.size <= LIMIT + COPY_HEADROOM_BYTES
        assert copy.headers is not None
        assert len(copy.headers[h.ERROR_MESSAGE]) <= MAX_ERROR_BYTES
        assert copy.headers[h.ERROR_MESSAGE].decode().startswith("?\U0001f600")
        assert len(copy.headers[h.ERROR_CLASS]) == MAX_ERROR_CLASS_BYTES
    assert dead.headers is not None
    assert len(dead.headers[h.DEAD_REASON]) == 64


async def test_a_dead_letter_carries_the_attempt_the_member_counted() -> None:
    """A producer's malformed ``pl-attempt`` (here 1 MiB) is not kept: the copy says 1."""
    producer = CheckingProducer()
    router = RetryRouter(producer, lambda: 1_700_000_000_000)
    await router.dead_letter(ROUTES, near_limit({h.ATTEMPT: b"9" * 100_000}), "fatal", None)
    await router.dead_letter(ROUTES, near_limit({h.ATTEMPT: b"3"}), "exhausted", None)
    assert [r.headers[h.ATTEMPT] for _, r, _ in producer.sent if r.headers] == [b"1", b"3"]


async def test_a_dead_letter_its_topic_refuses_is_replaced_by_a_marker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DLQ made by hand with a small limit gets a marker naming the message, and one error."""
    producer = CheckingProducer({"m.dlq": 10_000})
    router = RetryRouter(producer, lambda: 1_700_000_000_000)
    message = near_limit({h.EVENT_ID: b"e-1"})
    with caplog.at_level(logging.ERROR, "pipeline.retry.router"):
        delivered = await router.dead_letter(ROUTES, message, "fatal", DeadLetter("bad input"))
    ((topic, copy, _),) = producer.sent
    assert (topic, delivered.topic) == ("m.dlq", "m.dlq")
    assert copy.key == b"k"
    assert copy.headers is not None
    assert copy.headers[h.DEAD_REASON] == b"too_large"
    assert copy.headers[h.ERROR_MESSAGE] == b"bad input"
    assert h.ORIGIN_TOPIC not in copy.headers  # a redrive leaves it in the DLQ
    assert h.EVENT_ID not in copy.headers
    document = json.loads(copy.value)
    assert document["topic"] == "m"
    assert (document["partition"], document["offset"]) == (0, 7)
    assert document["origin"] == {"topic": "m", "partition": "0", "offset": "7"}
    assert document["reason"] == "fatal"
    assert document["refused_by"] == "m.dlq"
    assert document["bytes"] > LIMIT - 100
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("m[0]@7: its dead letter (")
    assert "m.dlq's max.message.bytes to PIPELINE_MAX_MESSAGE_BYTES + 4096" in line


async def test_a_retry_copy_its_tier_refuses_says_which_limit_to_raise() -> None:
    """A tier made by hand with a small limit: the refusal names the tier and the fix."""
    router = RetryRouter(CheckingProducer({"m.retry.1s": 10_000}), lambda: 1_700_000_000_000)
    with pytest.raises(MessageTooLarge, match=r"m\.retry\.1s's max\.message\.bytes to PIPELINE_"):
        await router.retry(ROUTES, near_limit(), 1, RuntimeError("503"))


async def test_a_message_out_of_attempts_is_dead_lettered_with_the_attempt_given() -> None:
    """``retry`` out of attempts dead-letters with its ``attempt``, not the message's header.

    On a main topic a producer's ``pl-attempt`` is no count (:func:`~pipeline.headers.attempt`);
    before, the dead letter of a message retried at its last attempt kept the producer's 99.
    """
    producer = CheckingProducer()
    router = RetryRouter(producer, lambda: 1_700_000_000_000)
    await router.retry(ROUTES, near_limit({h.ATTEMPT: b"99"}), ROUTES.max_attempts, DeadLetter("x"))
    [(topic, dead, _)] = producer.sent
    assert topic == ROUTES.dead_letter_topic
    assert dead.headers is not None
    assert dead.headers[h.DEAD_REASON] == b"exhausted"
    assert dead.headers[h.ATTEMPT] == str(ROUTES.max_attempts).encode()

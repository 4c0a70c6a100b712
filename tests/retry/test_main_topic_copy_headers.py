"""A message read from a lane's main topic is no retry copy, whatever copy headers it carries.

Only the retry router writes ``pl-origin-*``, ``pl-attempt``, ``pl-due-ms`` and
``pl-sla-from-ms``, on its copies to the retry tiers and the dead-letter topic; a redrive removes
them. On a main topic another producer wrote them: a hostile one, or an operator who produced a
dead letter there again by hand with its headers (``kcat``). Trusted there, they gave the
message another one's id (dropped as a duplicate of a message that ran, or run as a parked key's
head, its followers released ahead of the real copy, which was then dropped: lost), a forged
attempt count (dead-lettered at its first failure) and a forged SLA start (stamped on its retry
copy, which a batch lane then promotes at once).
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import (
    FAST,
    declare,
    eventually,
    flaky_head,
    lane_spec,
    produce,
    ran_until,
    running,
    the_dead_letter,
)

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.errors import DeadLetter, Retry
from pipeline.retry.guard_store import message_id, start_of
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def _origin(topic: str, partition: int, offset: int) -> dict[str, bytes]:
    return {
        h.ORIGIN_TOPIC: topic.encode(),
        h.ORIGIN_PARTITION: str(partition).encode(),
        h.ORIGIN_OFFSET: str(offset).encode(),
    }


def test_copy_headers_on_a_main_topic_give_no_other_id_or_attempt() -> None:
    """The guard's id and attempt of a main-topic message are its own; a tier's copy keeps them."""
    forged = {**_origin("pay", 0, 5), h.ATTEMPT: b"99"}
    first = Message("pay", 0, 9, b"k", b"v", dict(forged))
    assert h.origin("pay", forged) is None
    assert message_id(first) == "pay:0:9"
    start = start_of(first, ordered=True)
    assert (start.ident, start.attempt) == ("pay:0:9", 1)
    assert h.attempt("pay", forged) == 1
    assert "main topic" in h.origin_fault("pay", forged)
    copy = Message("pay.retry.5s", 0, 3, b"k", b"v", dict(forged))
    start = start_of(copy, ordered=True)
    assert (start.ident, start.attempt) == ("pay:0:5", 99)
    assert h.attempt("pay.retry.5s", forged) == 99


async def test_a_retried_message_produced_again_with_its_headers_runs(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A message produced again onto the main topic with a retried one's origin is handled.

    Before, it took the id of that message, whose retry copy had run, and was dropped as its
    duplicate, never handled.
    """
    spec = lane_spec(f"again_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"first" and ctx.attempt < 2:
            raise Retry("not yet")
        handled.append(event)

    producer = transport.producer()
    try:
        first = await producer.send(spec.name, b"first", key=b"k")
        member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
        async with running(member):
            await eventually(lambda: handled == [b"first"], timeout_s=30)
            headers = {**_origin(first.topic, first.partition, first.offset), h.ATTEMPT: b"2"}
            await producer.send(spec.name, b"again", key=b"k", headers=headers)
            await eventually(lambda: len(handled) + member.stats.duplicates >= 2, timeout_s=30)
    finally:
        await producer.close()
    assert handled == [b"first", b"again"]
    assert member.stats.duplicates == 0


async def test_a_forged_head_copy_on_the_main_topic_waits_behind_the_real_one(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A main-topic message naming a parked head's origin and attempt is held like a follower.

    Before, it ran as the key's head: its end released the follower ahead of the head's real
    copy, which then found its start ended and was dropped, never handled.
    """
    spec = lane_spec(
        f"head_{unique}",
        1,
        lane=f"head_{unique}",
        dead_letter=f"head_{unique}-dlq",
        retry={"tiers": ["5s"], "max_attempts": 3},
    )
    await declare(transport, spec)
    app, completed, attempts = flaky_head(spec, failures=1)

    producer = transport.producer()
    try:
        head = await producer.send(spec.name, b"a1", key=b"a")
        member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
        async with running(member):
            await eventually(lambda: member.stats.retried == 1, timeout_s=30)
            forged = {**_origin(head.topic, head.partition, head.offset), h.ATTEMPT: b"2"}
            await producer.send_many(
                spec.name, [Record(b"a2", b"a"), Record(b"forged", b"a", forged)]
            )
            await eventually(lambda: len(completed[b"a"]) + member.stats.duplicates >= 3, 60)
    finally:
        await producer.close()
    assert completed == {b"a": [b"a1", b"a2", b"forged"]}
    assert attempts == [1, 2]


async def test_a_forged_attempt_on_the_main_topic_is_attempt_1(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A main-topic message with ``pl-attempt: 99`` is retried at its first failure.

    Before, it ran as attempt 99 and was dead-lettered as exhausted at its first failure.
    """
    spec = lane_spec(f"att_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 2:
            raise Retry("not yet")

    await produce(transport, spec.name, [Record(b"m", b"k", {h.ATTEMPT: b"99"})])
    member = await ran_until(
        app, transport, redis, unique, lambda m: m.stats.handled + m.stats.dead_lettered >= 1, 30
    )
    assert attempts == [1, 2]
    assert member.stats.dead_lettered == 0


async def test_a_forged_sla_start_on_the_main_topic_is_not_copied(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A main-topic message's retry copy counts its SLA from that message's own time.

    The message carries ``pl-due-ms`` and ``pl-sla-from-ms: 1``. Before, the copy carried
    ``pl-sla-from-ms: 1``: on a batch lane, promoted at once.
    """
    spec = lane_spec(f"sla_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    seen: dict[int, Message] = {}

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        seen[ctx.attempt] = ctx.message
        if ctx.attempt < 2:
            raise Retry("not yet")

    forged = {h.DUE_MS: b"1", h.SLA_FROM_MS: b"1", h.PRODUCED_AT_MS: b"1"}
    await produce(transport, spec.name, [Record(b"m", b"k", forged)])
    await ran_until(app, transport, redis, unique, lambda m: m.stats.handled >= 1, 30)
    first, copy = seen[1], seen[2]
    assert first.timestamp_ms > 1
    assert copy.headers[h.SLA_FROM_MS] == str(first.timestamp_ms).encode()


async def test_a_forged_attempt_on_the_main_topic_is_not_its_dead_letters(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A main-topic message with ``pl-attempt: 99`` dead-lettered at once says attempt 1.

    The member counted it as attempt 1 (its handler's ``ctx.attempt``); before, its dead letter
    kept the producer's 99, which the dead letter's ``pl-attempt`` never is to be.
    """
    spec = lane_spec(f"dla_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        raise DeadLetter("refused")

    await produce(transport, spec.name, [Record(b"m", b"k", {h.ATTEMPT: b"99"})])
    await ran_until(app, transport, redis, unique, lambda m: m.stats.dead_lettered >= 1, 30)
    dead = await the_dead_letter(transport, spec, unique)
    assert attempts == [1]
    assert dead.headers[h.ATTEMPT] == b"1"

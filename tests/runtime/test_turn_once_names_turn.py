"""``ctx.once`` in a debounced turn names the whole turn, not only its last message.

A turn [old1, old2] ran its effect and then failed until dead-lettered; a new message of the
conversation came, then the dead letters were redriven: the next turn is [new, old1, old2], whose
last message is the same event as before. Keyed by that last message, the effect was skipped,
although it never ran for the new message. Each test records its turn before the member's runner
starts, so the turn holds exactly those messages whatever the host's pace.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from contract.helpers import consume_until
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.admission.debounce import Debouncer
from pipeline.envelope import Message, Record
from pipeline.errors import Retry
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.retry.guard_store import message_id
from pipeline.runtime import App, Context
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.keys import once_key
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

DEBOUNCE = {"key": "conversation_id", "quiet_s": 1, "max_wait_s": 20, "max_batch": 50}


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str
    n: int


def said(n: int) -> Record:
    """Message ``n`` of conversation c1, keyed by its conversation."""
    return Record(Said(conversation_id="c1", n=n).model_dump_json().encode(), b"c1")


async def record_turn(
    transport: Transport, redis: Redis, spec: TopicSpec, prefix: str, reader: str, count: int
) -> list[Message]:
    """Read the next ``count`` messages of ``spec``'s topic and buffer them as c1's next turn."""
    consumer = transport.consumer(reader, [spec.name])
    try:
        messages = await consume_until(consumer, lambda got: len(got) == count)
    finally:
        await consumer.close()
    assert spec.debounce is not None
    debouncer = Debouncer(redis, prefix, spec.lane, spec.debounce)
    for message in messages:
        await debouncer.record("c1", message)
    return messages


def numbers(events: Sequence[Said]) -> list[int]:
    """The numbers of a turn's events."""
    return [e.n for e in events]


async def test_a_redriven_turn_joined_by_a_new_message_runs_its_effect(
    kafka: Transport, redis: Redis, unique: str
) -> None:
    """[0, 1] replies, fails, is dead-lettered; [2, 0, 1] (2 new, then the redrive) replies again.

    Before, the second turn's ``ctx.once`` was keyed by its last message, 1, whose reply was
    recorded done: message 2 got no reply.
    """
    spec = lane_spec(f"turnname_{unique}", 1, debounce=DEBOUNCE, retry={"max_attempts": 1})
    await declare(kafka, spec)
    prefix = f"t{unique}"
    reader = f"read-{unique}"
    app = App([spec])
    turns: list[list[int]] = []
    replies: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        turns.append(numbers(events))

        async def reply() -> None:
            replies.append(numbers(events))

        await ctx.once("reply", reply)
        if len(turns) == 1:
            raise Retry("the reply was sent; the bookkeeping after it failed")

    try:
        await produce(kafka, spec.name, [said(0), said(1)])
        await record_turn(kafka, redis, spec, prefix, reader, 2)
        first = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(first):
            await eventually(lambda: first.stats.dead_lettered == 2)
        await produce(kafka, spec.name, [said(2)])  # the conversation goes on
        report = await Redrive(kafka, spec.dead_letter, Selection()).run()
        assert report.moved == 2
        await record_turn(kafka, redis, spec, prefix, reader, 3)  # [2, 0, 1]
        second = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(second):
            await eventually(lambda: len(turns) == 2 and second.stats.handled == 3)
    finally:
        await kafka.admin().delete_group(reader, [spec.name])
    assert turns == [[0, 1], [2, 0, 1]]
    assert replies == [[0, 1], [2, 0, 1]], "the turn with a new message got no reply"


async def test_a_redriven_turn_unchanged_does_not_run_its_effect_again(
    kafka: Transport, redis: Redis, unique: str
) -> None:
    """[0, 1] replies, fails, is dead-lettered, is redriven as [0, 1]: no second reply.

    The redriven copies carry their first delivery as their event id, so the turn's name is the
    one its first run recorded.
    """
    spec = lane_spec(f"turnsame_{unique}", 1, debounce=DEBOUNCE, retry={"max_attempts": 1})
    await declare(kafka, spec)
    prefix = f"t{unique}"
    reader = f"read-{unique}"
    app = App([spec])
    turns: list[list[int]] = []
    replies: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        turns.append(numbers(events))

        async def reply() -> None:
            replies.append(numbers(events))

        await ctx.once("reply", reply)
        if len(turns) == 1:
            raise Retry("the reply was sent; the bookkeeping after it failed")

    try:
        await produce(kafka, spec.name, [said(0), said(1)])
        await record_turn(kafka, redis, spec, prefix, reader, 2)
        first = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(first):
            await eventually(lambda: first.stats.dead_lettered == 2)
        report = await Redrive(kafka, spec.dead_letter, Selection()).run()
        assert report.moved == 2
        await record_turn(kafka, redis, spec, prefix, reader, 2)
        second = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(second):
            await eventually(lambda: len(turns) == 2 and second.stats.handled == 2)
    finally:
        await kafka.admin().delete_group(reader, [spec.name])
    assert turns == [[0, 1], [0, 1]]
    assert replies == [[0, 1]]


async def test_a_turn_whose_effect_an_earlier_release_ran_does_not_run_it_again(
    kafka: Transport, redis: Redis, unique: str
) -> None:
    """Rolling update: the effect's done record is under the turn's last message (as before).

    A member of the earlier release ran the reply of [0, 1] and recorded it under message 1's
    name; the turn failed and is retried by a member of this release: no second reply.
    """
    spec = lane_spec(f"turnroll_{unique}", 1, debounce=DEBOUNCE, retry={"max_attempts": 3})
    await declare(kafka, spec)
    prefix = f"t{unique}"
    reader = f"read-{unique}"
    try:
        await produce(kafka, spec.name, [said(0), said(1)])
        messages = await record_turn(kafka, redis, spec, prefix, reader, 2)
    finally:
        await kafka.admin().delete_group(reader, [spec.name])

    async def earlier_reply() -> None:
        """The earlier release's run of the effect."""

    await IdempotencyGuard(redis, prefix).once(
        spec.lane, message_id(messages[-1]), "reply", earlier_reply
    )
    app = App([spec])
    replies: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        async def reply() -> None:
            replies.append(numbers(events))

        await ctx.once("reply", reply)

    member = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.handled == 2)
    assert replies == []


async def test_a_run_under_the_earlier_name_makes_the_turn_wait_and_a_done_one_counts(
    redis: Redis, unique: str
) -> None:
    """An earlier release's member running the effect holds the turn off; its done record counts.

    While its claim is held the turn's ``ctx.once`` waits out about a lease, then raises
    ``Retry`` and leaves no record of its own; once it is done the effect is not run, and the
    turn's own record is done too (its next retry reads only that).
    """
    prefix = f"t{unique}"
    guard = IdempotencyGuard(redis, prefix, lease_ms=100)
    earlier = once_key(prefix, "lane", "topic:0:1", "reply")
    own = once_key(prefix, "lane", "turn:abc", "reply")
    runs: list[str] = []

    async def reply() -> None:
        runs.append("ran")

    await redis.set(earlier, "run:earlier-release", px=60_000)
    with pytest.raises(Retry):
        await guard.once("lane", "turn:abc", "reply", reply, also_done="topic:0:1")
    assert await redis.get(own) is None
    await redis.set(earlier, "done", px=60_000)
    assert await guard.once("lane", "turn:abc", "reply", reply, also_done="topic:0:1") is None
    assert await redis.get(own) == b"done"
    assert runs == []

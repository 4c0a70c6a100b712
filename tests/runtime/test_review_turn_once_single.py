"""``ctx.once`` of a turn that a new message joined ahead of a one-message turn's dead letter.

[0] replies, fails, is dead-lettered; message 2 comes, then the dead letter is redriven: the next
turn is [2, 0]. Its last message is 0, the name the first turn (a turn of one message) recorded
its reply under: read as an earlier release's record of the turn, it skipped the reply, which
never ran for message 2.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from runtime.test_turn_once_names_turn import DEBOUNCE, Said, record_turn, said

from pipeline.errors import Retry
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.retry.guard_store import message_id
from pipeline.runtime import App, Context
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def numbers(events: Sequence[Said]) -> list[int]:
    """The numbers of a turn's events."""
    return [e.n for e in events]


async def test_a_redriven_one_message_turn_joined_by_a_new_message_runs_its_effect(
    kafka: Transport, redis: Redis, unique: str
) -> None:
    """[0] replies, fails, is dead-lettered; [2, 0] (2 new, then the redrive) replies again."""
    spec = lane_spec(f"turnone_{unique}", 1, debounce=DEBOUNCE, retry={"max_attempts": 1})
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
        await produce(kafka, spec.name, [said(0)])
        await record_turn(kafka, redis, spec, prefix, reader, 1)
        first = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(first):
            await eventually(lambda: first.stats.dead_lettered == 1)
        await produce(kafka, spec.name, [said(2)])  # the conversation goes on
        report = await Redrive(kafka, spec.dead_letter, Selection()).run()
        assert report.moved == 1
        await record_turn(kafka, redis, spec, prefix, reader, 2)  # [2, 0]
        second = Member(app, kafka, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
        async with running(second):
            await eventually(lambda: len(turns) == 2 and second.stats.handled == 2)
    finally:
        await kafka.admin().delete_group(reader, [spec.name])
    assert turns == [[0], [2, 0]]
    assert replies == [[0], [2, 0]], "the turn with a new message got no reply"


async def test_a_one_message_turn_whose_effect_an_earlier_release_ran_does_not_run_it_again(
    kafka: Transport, redis: Redis, unique: str
) -> None:
    """Rolling update: the reply of [0] is recorded under message 0's name (as before): no rerun."""
    spec = lane_spec(f"turnoneroll_{unique}", 1, debounce=DEBOUNCE, retry={"max_attempts": 3})
    await declare(kafka, spec)
    prefix = f"t{unique}"
    reader = f"read-{unique}"
    try:
        await produce(kafka, spec.name, [said(0)])
        messages = await record_turn(kafka, redis, spec, prefix, reader, 1)
    finally:
        await kafka.admin().delete_group(reader, [spec.name])

    async def earlier_reply() -> None:
        """The earlier release's run of the effect."""

    await IdempotencyGuard(redis, prefix).once(
        spec.lane, message_id(messages[0]), "reply", earlier_reply
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
        await eventually(lambda: member.stats.handled == 1)
    assert replies == []

"""A hot key's queued messages sent away from a full partition: the edges of that path.

A partition paused full marks the messages queued behind a hot key's head to be deferred when
their turn comes (:meth:`Chain.spill`): the first parks its key through the first retry tier,
the others are held behind it in Redis and released in order. These tests run it against the
real brokers and Redis: what must not change (expiry, order, one run each) and what it must not
cost (a backlog of many keys spills nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

SMALL = FAST.model_copy(
    update={"partition_high_water": 20, "partition_low_water": 10, "poll_max": 10}
)
"""A buffer of 20 filled by polls of 10 at most: the buffer bounds what the member holds."""
assert isinstance(SMALL, RuntimeSettings)


def _spilled(member: Member) -> bool:
    """Whether ``member`` marked messages to leave (a spill happened and is not settled)."""
    return bool(member._handler.deferred)


async def test_a_spilled_message_past_its_max_age_expires_instead_of_running(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """A hot key's backlog waits past ``max_age`` behind its head; none of it runs.

    The message that parks the key went through the tier unexpired in the member, and its copy,
    whose ``max_age`` counts from its due time, ran: an expired message ran because it was
    spilled. Every message queued behind the head expires (dropped), in or out of Redis.
    """
    spec = lane_spec(
        f"hotexp_{unique}", 1, max_age="1s", on_expiry="drop", retry={"tiers": ["200ms"]}
    )
    await declare(transport, spec)
    app = App([spec])
    ran: list[bytes] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        ran.append(event.value)
        if event.value == b"hot:0":
            await release.wait()

    hot = [Record(b"hot:%d" % n, b"hot") for n in range(40)]
    await produce(transport, spec.name, hot)
    produced_ms = int(time.time() * 1000)
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: _spilled(member))
            # Every hot message is past its max_age (a condition on the clock, not a pause).
            await eventually(lambda: time.time() * 1000 > produced_ms + 1_500)
            release.set()
            await eventually(lambda: member.stats.expired + len(ran) >= 40)
    finally:
        await redis.aclose()
    assert ran == [b"hot:0"]
    assert member.stats.expired == 39


async def test_the_bench_backlog_of_many_keys_spills_nothing(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """20,000 messages over 1,000 keys, 4 partitions, a no-op handler, the default settings.

    A backlog drained fast has a few messages queued behind each head: sending them away would
    only send them round through the tier and Redis for nothing. Nothing is deferred or parked.
    """
    spec = lane_spec(f"hotbench_{unique}", 4, retry={"tiers": ["1s", "5s"]})
    await declare(transport, spec)
    app = App([spec])
    handled = 0

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        nonlocal handled
        handled += 1

    await produce(transport, spec.name, [Record(b"x", b"k%d" % (i % 1_000)) for i in range(20_000)])
    settings = FAST
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: handled >= 20_000, timeout_s=120)
    finally:
        await redis.aclose()
    assert (member.stats.deferred, member.stats.parked) == (0, 0)
    assert handled == 20_000


async def test_a_hot_keys_head_failing_while_its_followers_are_marked(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """The head runs when the partition spills its followers, then fails once (retried).

    (While the head runs, its followers cannot leave and the partition sends no second batch
    away: the other keys behind them in the partition wait for it, as before the spill.)

    Its followers, marked to leave, are held behind its parked key; the key's messages run in
    order, each once (its head twice: attempt 1 failed, attempt 2 handled).
    """
    spec = lane_spec(f"hotfail_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    done: dict[bytes, list[int]] = defaultdict(list)
    attempts: list[int] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if event.key == b"hot" and n == 0:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                await release.wait()
                raise RuntimeError("flaky dependency")
        done[event.key or b""].append(n)

    hot = [Record(b"hot:%d" % n, b"hot") for n in range(60)]
    cold = [Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)]
    await produce(transport, spec.name, [*hot, *cold])
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: _spilled(member))
            release.set()
            await eventually(lambda: len(done[b"hot"]) >= 60)
            await eventually(lambda: all(done[b"cold%d" % n] for n in range(4)))
    finally:
        await redis.aclose()
    assert done[b"hot"] == list(range(60))
    assert attempts == [1, 2]


async def test_a_hot_run_of_messages_without_a_key(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """An ordered lane's keyless messages are one key: spilled, they still run in order, once."""
    spec = lane_spec(f"hotnone_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    ran: list[int] = []
    cold: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if event.key is None:
            await asyncio.sleep(0.01)
            ran.append(n)
        else:
            cold.append(n)

    await produce(
        transport,
        spec.name,
        [
            *[Record(b"none:%d" % n, None) for n in range(60)],
            *[Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)],
        ],
    )
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: len(ran) >= 60 and len(cold) == 4)
    finally:
        await redis.aclose()
    assert ran == list(range(60))
    assert member.stats.deferred >= 1

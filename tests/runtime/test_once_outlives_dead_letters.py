"""A ``ctx.once`` record outlives every copy of its event the lane's topics can still give back.

A message whose effect ran and that then failed for good waits in the dead-letter topic (at
least two weeks) for a human to redrive it, with its event id, so that the effect does not run
again. Its record must outlast that wait, and the retry path before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import pass_expiries

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.retry.guard_store import retry_path_ms
from pipeline.runtime import App, Context
from pipeline.runtime.idempotency import IdempotencyGuard, lane_once_ttls
from pipeline.runtime.keys import once_key
from pipeline.runtime.member import Member
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS
from pipeline.transport.protocol import Transport

DAY_MS = 86_400_000


@pytest.fixture
async def client(redis_service: str) -> AsyncIterator[Redis]:
    """A client of the test Redis (keys under a ``unique`` prefix, deleted after the test)."""
    client = Redis.from_url(redis_service)
    yield client
    await client.aclose()


async def _noop() -> None:
    return None


async def _charged() -> str:
    return "charged"


async def test_the_record_outlives_the_dead_letter_topics_retention(
    client: Redis, unique: str
) -> None:
    """As the member builds it, a done record outlives two weeks of dead letters."""
    guard = IdempotencyGuard(client, f"t{unique}", lease_ms=2_000)
    await guard.once("orders", "evt-1", "charge", _noop)
    ttl_ms = await client.pttl(once_key(f"t{unique}", "orders", "evt-1", "charge"))
    assert ttl_ms > DLQ_MIN_RETENTION_MS


async def test_a_lane_keeping_its_messages_longer_keeps_its_records_longer(
    client: Redis, unique: str
) -> None:
    """A lane retaining 30 days keeps its dead letters 30 days: its records last that, and more."""
    long = lane_spec(f"long_{unique}", 1, retention="30d", retry={"tiers": ["5s", "1m", "10m"]})
    short = lane_spec(f"short_{unique}", 1, retry={"tiers": ["1s"]})
    # The largest retention a lane may declare: kept as long as Redis can say.
    huge = lane_spec(f"huge_{unique}", 1, retention=2**63 - 1)
    ttls = lane_once_ttls([long, short, huge])
    assert ttls[long.lane] >= 30 * DAY_MS + retry_path_ms(long)
    assert ttls[short.lane] >= DLQ_MIN_RETENTION_MS + retry_path_ms(short)
    guard = IdempotencyGuard(client, f"t{unique}", lease_ms=2_000, lane_ttl_ms=ttls)
    for spec in (long, short, huge):
        await guard.once(spec.lane, "evt-1", "charge", _noop)
        ttl_ms = await client.pttl(once_key(f"t{unique}", spec.lane, "evt-1", "charge"))
        assert ttl_ms > min(ttls[spec.lane], 2**61) - 60_000, spec.lane


async def test_a_redelivery_after_the_bound_runs_the_effect_again_and_one_before_does_not(
    client: Redis, unique: str
) -> None:
    """The bound is what the guarantee lasts: a record found done is kept that long again."""
    guard = IdempotencyGuard(client, f"t{unique}", lease_ms=2_000)
    calls: list[str] = []

    async def charge() -> str:
        calls.append("charge")
        return "charged"

    key = once_key(f"t{unique}", "orders", "evt-1", "charge")
    await guard.once("orders", "evt-1", "charge", charge)
    bound_ms = await client.pttl(key)
    await client.pexpire(key, 60_000)  # most of the bound has passed
    # A redrive finds it done, and keeps it the whole bound again (a later redrive is covered).
    await guard.once("orders", "evt-1", "charge", charge)
    assert calls == ["charge"]
    assert await client.pttl(key) > bound_ms - 60_000
    # The whole bound passes with no delivery (and a minute: the renewal counted from later).
    await pass_expiries(client, key, bound_ms + 60_000)
    await guard.once("orders", "evt-1", "charge", charge)
    assert calls == ["charge", "charge"]


async def test_a_members_records_last_as_long_as_their_lanes_topics(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """The member gives its guard each lane's bound: a lane retaining 30 days keeps 30 days."""
    spec = lane_spec(f"oncelong_{unique}", 1, retention="30d")
    await declare(transport, spec)
    app = App([spec])
    ran: list[str] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await ctx.once("charge", _charged)
        ran.append(ctx.event_id or "")

    await produce(transport, spec.name, [Record(b"x", b"k", {h.EVENT_ID: b"evt-1"})])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: len(ran) == 1)
    ttl_ms = await redis.pttl(once_key(f"t{unique}", spec.lane, "evt-1", "charge"))
    assert ttl_ms > 30 * DAY_MS

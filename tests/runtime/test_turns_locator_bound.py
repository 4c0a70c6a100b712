"""A debounced lane keeping its messages longer than a week keeps its events findable that long."""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

DAY_MS = 86_400_000
WAITING = {"key": "conversation_id", "quiet_s": 60, "max_wait_s": 120, "max_batch": 50}
"""A turn that does not fire while the test looks."""


async def _locator_ttl_ms(
    transport: Transport, redis: Redis, unique: str, name: str, retention: int | str
) -> int:
    """The PTTL of the locator of an event a member buffered on a lane retaining ``retention``."""
    spec = lane_spec(f"{name}_{unique}", 1, retention=retention, debounce=WAITING)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(events: list[bytes], ctx: Context) -> None:
        """Never called while the test looks (the turn waits a minute)."""

    body = b'{"conversation_id": "c1"}'
    await produce(transport, spec.name, [Record(body, b"c1", {h.EVENT_ID: b"evt-1"})])
    prefix = f"t{unique}"
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    tag = debounce_keys.lane_tag(prefix, spec.lane)
    try:
        async with running(member):
            await eventually(lambda: member.stats.buffered == 1)
        (locator,) = [k async for k in redis.scan_iter(match=f"{tag}:e:*")]
        return int(await redis.pttl(locator))
    finally:
        async for key in redis.scan_iter(match=f"{tag}*"):
            await redis.delete(key)


async def test_a_lane_retaining_30_days_keeps_its_locators_30_days(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """The ingress's sweeper finds a buffered event by its locator as long as the lane keeps it.

    The member built every lane's debouncer with the 7-day bound, so a lane retaining 30 days
    had its buffered events reported as not held (and replayed) after a week of waiting.
    """
    assert await _locator_ttl_ms(transport, redis, unique, "turnlocator", "30d") > 29 * DAY_MS


async def test_a_lane_kept_for_ever_still_debounces(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A retention of 2**63-1 ms (Kafka's "forever"): the locator's bound stays one Redis takes.

    Passed through Lua as a float, or past 2**63 ms from now, Redis refused the expiry and every
    record failed: the lane ran each message as a turn of its own.
    """
    ttl_ms = await _locator_ttl_ms(transport, redis, unique, "turnforever", 2**63 - 1)
    assert ttl_ms > 365 * DAY_MS

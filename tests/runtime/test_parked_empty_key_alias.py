"""A keyless message is never dropped as stale behind a message with an empty key.

The guard names a key by its bytes, a message without a key and one with the empty key alike
(``encode_key``), but the key lanes and the throttle gate tell the two apart and run them side
by side. So when ``e`` (key ``b""``) fails and parks that key, keyless messages read before it
may not have reached the guard: they wait behind a keyless run still going. A watermark taken
from ``e`` (every earlier message of its key finished here) would not hold for them, and the
first of them to come to the guard would be dropped as stale without ever running. Held behind
``e`` instead, it runs once ``e``'s copy has. A member on each real transport and Redis.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import delete_group_after

from pipeline.envelope import Record
from pipeline.retry.keys import guard_keys
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_a_keyless_message_queued_when_the_empty_key_parks_runs(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """``a1`` (no key) runs long; ``a2`` (no key) waits behind it; ``e`` (key ``b""``) parks."""
    spec = lane_spec(f"alias_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    a1_runs, go_a1, go_copy = asyncio.Event(), asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1":
            a1_runs.set()
            await go_a1.wait()
        if event == b"e":
            if ctx.attempt == 1:
                raise RuntimeError("flaky dependency")
            await go_copy.wait()  # the key stays parked until a2 was decided
        handled.append(f"{event.decode()}:{ctx.attempt}")

    await produce(
        transport,
        spec.name,
        [Record(b"a1", None), Record(b"a2", None), Record(b"e", b"")],
    )
    group = f"g-{unique}"
    delete_group_after(transport, group, spec.topic_names())
    member = Member(app, transport, group, FAST, redis=redis, redis_prefix=unique)
    keys = guard_keys(unique, spec.lane)
    async with running(member):
        await eventually(a1_runs.is_set)
        # e failed and went to its tier (its key parked first) while a1 still runs.
        await eventually(lambda: member.stats.retried >= 1)
        assert await redis.hlen(keys.parked) == 1
        go_a1.set()
        await eventually(lambda: member.stats.parked + member.stats.duplicates >= 1)
        go_copy.set()
        await eventually(lambda: {"e:2", "a2:1"} <= set(handled) or bool(member.stats.duplicates))
    assert member.stats.duplicates == 0, handled
    assert handled == ["a1:1", "e:2", "a2:1"]

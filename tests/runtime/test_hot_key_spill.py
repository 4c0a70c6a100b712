"""A hot conversation must not keep its partition's other conversations unread behind it.

On an ordered lane (no throttle), one key's backlog runs one message at a time; held in the
member it filled its partition's buffer and paused it, and every other key's messages behind it
in the partition waited, unread, until the hot key had run down to the low-water mark, again and
again. A partition that pauses full now sends the longest keys' queued messages away (parked in
Redis behind a deferred head, released in order), so the others are read and run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_a_hot_key_does_not_keep_its_partitions_other_keys_unread(
    transport: Transport, redis_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """80 messages of key ``hot`` (20 ms each) fill a 20-message buffer; 4 others go by early.

    Polls of 10 at most, so the buffer bounds what the member holds.

    Before, the 4 ran only after about 70 of the hot key's. The hot key still runs in order,
    each message once.
    """
    spec = lane_spec(f"hotkey_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []
    by_key: dict[bytes, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if event.key == b"hot":
            await asyncio.sleep(0.02)
        handled.append(event.value)
        by_key[event.key or b""].append(int(event.value.split(b":")[1]))

    hot = [Record(b"hot:%d" % n, b"hot") for n in range(80)]
    cold = [Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)]
    await produce(transport, spec.name, [*hot, *cold])
    settings = FAST.model_copy(
        update={"partition_high_water": 20, "partition_low_water": 10, "poll_max": 10}
    )
    assert isinstance(settings, RuntimeSettings)
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=f"t{unique}")
    try:
        with caplog.at_level(logging.INFO, "pipeline.runtime.chain"):
            async with running(member):
                await eventually(lambda: len(handled) == 84)
    finally:
        await redis.aclose()
    told = [r.getMessage() for r in caplog.records if r.name == "pipeline.runtime.chain"]
    assert told, "a spill is told"
    assert told[0].startswith(f"lane {spec.lane}: {spec.name}[0] is full"), told
    assert "queued behind a hot key sent away" in told[0]
    cold_done = max(handled.index(b"cold:%d" % n) for n in range(4))
    hot_before = sum(1 for value in handled[:cold_done] if value.startswith(b"hot"))
    assert hot_before < 40, handled
    assert by_key[b"hot"] == list(range(80))
    assert member.stats.deferred >= 1

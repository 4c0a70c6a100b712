"""A stopping member keeps its lanes' group lease through the drain.

Before, the lease was renewed only until the stop: a drain longer than the lease (a long
``PIPELINE_RUNTIME__SHUTDOWN_GRACE_S``, a handler finishing its work) let the lease run out, and
another group started on the lane beside the runs still going here.
"""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, held_app, lane_spec, produce

from pipeline.envelope import Record
from pipeline.retry.keys import guard_keys
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

RENEWALS = 3
"""Distinct renewals seen during the drain (the reap tick renews about every 2 s)."""


async def test_the_lease_is_renewed_while_the_member_drains(
    transport: Transport, redis: Redis, prefix: str, unique: str
) -> None:
    """A run outlasting the stop: the lease's renewal time moves on until the member leaves."""
    spec = lane_spec(f"drain_{unique}", 1)
    await declare(transport, spec)
    app, started, release = held_app(spec)
    settings = FAST.model_copy(update={"shutdown_grace_s": 120.0})
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=prefix)
    key = guard_keys(prefix, spec.lane).group
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    renewals: set[bytes | None] = set()
    try:
        await asyncio.wait_for(member.polling.wait(), 60)
        await produce(transport, spec.name, [Record(b"long", b"k")])
        await asyncio.wait_for(started.wait(), 60)
        stop.set()  # the run goes on: the member drains
        deadline = time.monotonic() + 30
        while len(renewals) < RENEWALS and time.monotonic() < deadline:
            renewals.add(await redis.hget(key, "at"))
            await asyncio.sleep(0.05)
        assert not task.done()
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(task, 60)
    assert None not in renewals  # held all along
    assert len(renewals) >= RENEWALS
    assert await redis.exists(key) == 0  # freed once it left

"""A lane is consumed by one group at a time: a second group waits for the first's lease.

Before, two groups on one lane (``--group replies`` and ``--group messages``, as a reader of the
README and getting-started could start them) took each other's claims every few seconds
(``assigned to another member process since they came here``, partitions revoked as lost) and
the second ran none of the messages waiting for it: the run guard's Redis state is the lane's.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry as ClientRetry
from redis.backoff import NoBackoff
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import delete_group_after

from pipeline.envelope import Record
from pipeline.errors import PipelineError
from pipeline.retry.keys import guard_keys
from pipeline.runtime import App, Context
from pipeline.runtime.lane_lease import WAIT_LINE_EVERY_S, lease_ms, redis_where
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

LEASE = "pipeline.runtime.lane_lease"
LEASE_S = lease_ms(FAST.liveness_ms) / 1000


def _member(
    spec: TopicSpec, seen: list[bytes], transport: Transport, group: str, redis: Redis, prefix: str
) -> Member:
    """A member of ``group`` whose handler of ``spec``'s lane appends each event to ``seen``."""
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        seen.append(event)

    return Member(app, transport, group, FAST, redis=redis, redis_prefix=prefix)


def _lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LEASE and r.levelno == level and text in r.getMessage()
    ]


async def test_a_second_group_waits_for_the_first_then_takes_over(
    transport: Transport, redis: Redis, prefix: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The second group says who holds the lane and runs nothing until the first stops."""
    caplog.set_level(logging.INFO, logger=LEASE)
    spec = lane_spec(f"one_{unique}", 2)
    await declare(transport, spec)
    first_group, second_group = f"g-{unique}", f"g2-{unique}"
    delete_group_after(transport, second_group, [spec.name])
    first_seen: list[bytes] = []
    second_seen: list[bytes] = []
    first = _member(spec, first_seen, transport, first_group, redis, prefix)
    second = _member(spec, second_seen, transport, second_group, redis, prefix)
    stop_second = asyncio.Event()
    async with running(first):
        await asyncio.wait_for(first.polling.wait(), 60)
        waiting = asyncio.create_task(second.run(stop_second))
        began = time.monotonic()
        try:
            await eventually(lambda: bool(_lines(caplog, logging.WARNING, "is consumed by")))
            await produce(
                transport, spec.name, [Record(b"old-%d" % i, b"k%d" % i) for i in range(3)]
            )
            await eventually(lambda: len(first_seen) == 3)
            assert not second.polling.is_set()  # never joined its group
            assert second_seen == []
        except BaseException:
            stop_second.set()
            await asyncio.wait_for(waiting, 60)
            raise
    try:
        # The first stopped gracefully and freed the lane: the second takes it within the lease.
        await asyncio.wait_for(second.polling.wait(), LEASE_S)
        waited_s = time.monotonic() - began
        await produce(transport, spec.name, [Record(b"new-%d" % i, b"k%d" % i) for i in range(3)])
        await eventually(lambda: {b"new-0", b"new-1", b"new-2"} <= set(second_seen))
    finally:
        stop_second.set()
        await asyncio.wait_for(waiting, 60)
    assert sorted(first_seen) == [b"old-0", b"old-1", b"old-2"]
    lines = _lines(caplog, logging.WARNING, "is consumed by")
    assert 1 <= len(lines) <= 1 + waited_s // WAIT_LINE_EVERY_S  # not one a look (every 2 s)
    expected = (
        f"lane {spec.lane!r} is consumed by group {first_group!r} (its lease in Redis"
        f" {redis_where(redis)} renewed N s ago); a lane is consumed by one group at a time:"
        f" stop group {first_group!r} (its lease ends {LEASE_S:g} s after its last member"
        " stops) or run this lane under the same group"
    )
    assert re.sub(r"renewed \d+ s ago", "renewed N s ago", lines[0]) == expected
    assert await redis.exists(guard_keys(prefix, spec.lane).group) == 0  # freed at the stop


async def test_members_of_one_group_share_the_lane(
    transport: Transport, redis: Redis, prefix: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A second member of the same group joins at once; the lane stays held until both stop."""
    spec = lane_spec(f"same_{unique}", 2)
    await declare(transport, spec)
    seen: list[bytes] = []
    key = guard_keys(prefix, spec.lane).group
    group = f"g-{unique}"
    one = _member(spec, seen, transport, group, redis, prefix)
    two = _member(spec, seen, transport, group, redis, prefix)
    async with running(one):
        async with running(two):
            await asyncio.wait_for(asyncio.gather(one.polling.wait(), two.polling.wait()), 60)
            await produce(transport, spec.name, [Record(b"m-%d" % i, b"k%d" % i) for i in range(4)])
            await eventually(lambda: len(seen) == 4)
        assert await redis.hget(key, "group") == group.encode()  # the other member holds it
    assert await redis.exists(key) == 0
    assert not _lines(caplog, logging.WARNING, "is consumed by")


async def test_a_member_whose_lane_another_group_took_stops(
    transport: Transport, redis: Redis, prefix: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its lease lapsed (a Redis outage) and another group took the lane: CRITICAL, then stop."""
    spec = lane_spec(f"taken_{unique}", 1)
    await declare(transport, spec)
    seen: list[bytes] = []
    key = guard_keys(prefix, spec.lane).group
    member = _member(spec, seen, transport, f"g-{unique}", redis, prefix)
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    try:
        await asyncio.wait_for(member.polling.wait(), 60)
        async with redis.pipeline(transaction=True) as tx:  # its lease ran out; the other took it
            tx.delete(key)
            tx.hset(key, mapping={"group": "other", "at": 0, "lease": 30_000, "m:x": 2**60})
            tx.pexpire(key, 30_000)
            await tx.execute()
        with pytest.raises(PipelineError, match="commit loop failed"):
            await asyncio.wait_for(task, 60)
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, 60)
    [line] = _lines(caplog, logging.CRITICAL, "")
    assert f"lane {spec.lane!r} is consumed by group 'other' now" in line
    assert await redis.hget(key, "group") == b"other"  # another group's lease is left alone


async def test_a_redis_out_of_reach_at_start_does_not_hold_the_start(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The member consumes; one warning says the lease could not be held."""
    spec = lane_spec(f"noredis_{unique}", 1)
    await declare(transport, spec)
    seen: list[bytes] = []
    # Nothing listens on port 1; no client-side retries, so each refusal is immediate.
    dead = Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=ClientRetry(NoBackoff(), 0)
    )
    member = _member(spec, seen, transport, f"g-{unique}", dead, f"t{unique}")
    try:
        async with running(member):
            await produce(transport, spec.name, [Record(b"m-%d" % i, b"k") for i in range(3)])
            await eventually(lambda: len(seen) == 3)
    finally:
        await dead.aclose()
    [line] = _lines(caplog, logging.WARNING, "could not hold the group lease")
    assert "redis://127.0.0.1:1/0" in line

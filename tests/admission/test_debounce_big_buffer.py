"""A conversation with thousands of buffered messages: finding one of them reads a few, not all.

A turn failing for hours (or runners down) while a conversation keeps talking leaves its
buffer growing: 100,000 messages is a night's chatter. Whether a buffered event still waits is
asked by the ingress's sweeper (``db_held``, for every overdue row of a batch) and by ``record``
for a replayed copy or a redelivery past the conversation's last 64; each read the whole buffer
(``LRANGE 0 -1``) inside the Redis function, so one sweep of 500 rows of such a conversation
held Redis for many seconds (a single ``db_held`` of 50 events over 100,000 buffered messages of
200 bytes answered BUSY to every other client). The work is counted here as Redis counts it:
the elements of the buffer the functions' commands read, seen through ``MONITOR``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.held import BufferedEvents
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"
BUFFERED = 3_000


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane no other test uses; its keys are deleted after the test."""
    name = f"debbig_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.unlink(key)


def webhook(offset: int, event_id: str) -> Message:
    """An ingress event of conversation c1 at ``offset`` carrying ``event_id``."""
    headers = {h.EVENT_ID: event_id.encode(), h.REPLAY_COUNT: b"0"}
    return Message("hooks", 0, offset, b"c1", b"x" * 200, headers, 1_000 + offset)


def elements_read(command: str, buffer: str, length: int) -> int:
    """How many elements of ``buffer`` (``length`` long) a monitored command read."""
    words = command.split(" ")
    if len(words) < 2 or words[1] != buffer:
        return 0
    if words[0] == "LINDEX":
        return 1
    if words[0] == "LRANGE":
        start, stop = (int(w) if int(w) >= 0 else length + int(w) for w in words[2:4])
        return max(0, min(stop, length - 1) - max(start, 0) + 1)
    return 0


async def test_finding_a_buffered_event_reads_a_few_of_its_conversations_messages(
    redis: Redis, redis_service: str, lane: str
) -> None:
    """db_held, a replayed copy and a redelivery past the last 64 read far less than the buffer."""
    policy = DebouncePolicy(key="conversation_id", quiet_s=3_600.0, max_wait_s=7_200.0)
    debouncer = Debouncer(redis, PREFIX, lane, policy)
    for start in range(0, BUFFERED, 50):
        await asyncio.gather(
            *(debouncer.record("c1", webhook(i, f"evt-{i}")) for i in range(start, start + 50))
        )
    buffer = debounce_keys.buffer_key(PREFIX, lane, "c1")
    assert await redis.llen(buffer) == BUFFERED
    asked = [f"evt-{i}" for i in range(0, BUFFERED, BUFFERED // 20)] + [f"evt-{BUFFERED - 1}"]
    sweeper = BufferedEvents(Redis.from_url(redis_service), PREFIX, [lane])
    watcher = Redis.from_url(redis_service, decode_responses=True)
    read = 0
    try:
        async with watcher.monitor() as monitor:
            held = await sweeper.held(lane, asked, 60_000)
            replayed = await debouncer.record("c1", webhook(BUFFERED + 7, "evt-3"))  # a copy
            redelivered = await debouncer.record("c1", webhook(5, "evt-5"))  # past the last 64
            end = f"end-of-{lane}"
            await redis.echo(end)
            async for seen in monitor.listen():
                if seen["command"] == f"ECHO {end}":
                    break
                if seen["client_type"] == "lua":
                    read += elements_read(seen["command"], buffer, BUFFERED)
    finally:
        await sweeper.close()
        await watcher.aclose()
    assert held == set(asked)
    assert (replayed, redelivered) == (-1, -1)
    assert await redis.llen(buffer) == BUFFERED
    # 23 lookups: each may read a few dozen elements, none the whole buffer
    assert read < BUFFERED

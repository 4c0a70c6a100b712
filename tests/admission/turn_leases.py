"""What the tests of a debounced turn's lease share: one lane's debouncer and its messages."""

from __future__ import annotations

from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

PREFIX = "pltest"
LEASE_MS = 1_500  # renewed every 0.5 s
BOUND_S = 30  # how long a failing run may wait before the test gives up


async def drop_lane(redis: Redis, lane: str) -> None:
    """Delete every key of ``lane``'s debouncer."""
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, lane)}*"):
        await redis.unlink(key)


def debouncer_of(redis: Redis, lane: str, lease_ms: int = LEASE_MS) -> Debouncer:
    """A debouncer whose turns are due 50 ms after a conversation's last message."""
    policy = DebouncePolicy(key="conversation_id", quiet_s=0.05, max_wait_s=1.0)
    return Debouncer(redis, PREFIX, lane, policy, lease_ms=lease_ms)


def message(offset: int, text: str) -> Message:
    """A consumed message of conversation c1 whose value is ``text``."""
    return Message("chat", 0, offset, b"c1", text.encode(), {}, 1_000 + offset)


async def lapse(redis: Redis, lane: str) -> None:
    """Move the lease of conversation c1 into the past, as a pause longer than it would."""
    await redis.zadd(debounce_keys.due_key(PREFIX, lane), {"c1": 0})
    await redis.hset(debounce_keys.state_key(PREFIX, lane, "c1"), "lu", 0)

"""Where a key is parked from is compared by number, on its own partition only.

Offsets travel as decimal text (``topic:partition:offset``) and are compared in Redis as text
of the same length first: 9 is below 10, 99 below 100, and offsets past 2^53 (which a Lua number
cannot hold exactly) compare exactly. A partition whose number starts as the parking one's does
(1 and 10) is another partition. Real Redis, driven through :class:`GuardStore`.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from runtime.helpers import lane_spec

from pipeline.envelope import Message
from pipeline.retry.guard_store import Decision, GuardStore, Start, lane_guards
from pipeline.retry.held import encode_held
from pipeline.retry.keys import encode_key

KEY = encode_key(b"k")


def topic(unique: str) -> str:
    """The lane's main topic."""
    return f"num_{unique}"


async def parked_from(redis: Redis, unique: str, partition: int, offset: int) -> GuardStore:
    """A guard store of a fresh ordered lane whose key ``k`` was parked from ``offset``."""
    spec = lane_spec(topic(unique), 11, retry={"tiers": ["5s"]})
    store = lane_guards(redis, f"t{unique}", [spec])[spec.lane]
    at = f"{spec.name}:{partition}:{offset}"
    head = Start(at, KEY, at, ordered=True)
    head.below = at
    assert await store.route(head, 2, park=True)
    return store


async def decided(store: GuardStore, unique: str, partition: int, offset: int) -> Decision:
    """The decision on a first delivery of ``k`` read at ``offset`` of ``partition``."""
    at = f"{topic(unique)}:{partition}:{offset}"
    start = Start(at, KEY, at, ordered=True)
    start.body = encode_held(Message(topic(unique), partition, offset, b"k", b"v"))
    [(decision, _)] = await store.begin_many([], [start])
    return decision


@pytest.mark.parametrize(
    ("parked", "below", "above"),
    [
        (10, 9, 11),
        (100, 99, 101),
        (1000, 999, 10000),
        (2**53 + 2, 2**53 + 1, 2**53 + 3),
        (10**18, 10**18 - 1, 10**18 + 1),
    ],
)
async def test_offsets_compare_as_numbers(
    redis: Redis, unique: str, parked: int, below: int, above: int
) -> None:
    """Below the parking offset: stale; above it: held behind the head."""
    store = await parked_from(redis, unique, 0, parked)
    assert await decided(store, unique, 0, below) == "stale"
    assert await decided(store, unique, 0, above) == "held"


async def test_only_the_parking_partition(redis: Redis, unique: str) -> None:
    """Partitions 10 and 0 are not partition 1, whatever their offsets."""
    store = await parked_from(redis, unique, 1, 50)
    assert await decided(store, unique, 10, 5) == "held"
    assert await decided(store, unique, 0, 5) == "held"
    assert await decided(store, unique, 1, 5) == "stale"

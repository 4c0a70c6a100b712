"""Whose clock says a member is alive or a release lease ran out: Redis's, not each member's.

Two members on one Redis, one of them on a host whose clock is a minute ahead (simulated by
patching ``time.time`` around that member's calls only, as a skewed host would see it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import Handlers, guarded_lane, main_message, member_guard, retry_copy

from pipeline.envelope import TopicPartition
from pipeline.retry.guard_store import GuardStore, Start, lane_guards

SKEW_S = 60.0
T = TypeVar("T")


async def _skewed(call: Awaitable[T], skew_s: float = SKEW_S) -> T:
    """Await ``call`` in a process whose clock is ``skew_s`` off the others'."""
    real = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + skew_s)
        return await call


def _store(redis: Redis, prefix: str, unique: str) -> GuardStore:
    lane = guarded_lane(f"clock_{unique}")
    return lane_guards(redis, prefix, [lane.spec])[lane.name]


async def test_a_live_member_is_not_taken_for_dead_by_one_whose_clock_is_ahead(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A copy of a start a live member still runs waits (busy), whatever the reader's clock."""
    a, b = _store(redis, prefix, unique), _store(redis, prefix, unique)
    start = Start("t:0:5", "k", "t:0:5", ordered=True)
    assert await a.begin_many([], [start]) == [("process", 1)]
    await a.live()
    assert await _skewed(b.begin_many([], [start])) == [("busy", 1)]
    assert await _skewed(b.begin_many([], [start]), -SKEW_S) == [("busy", 1)]


async def test_a_live_members_claim_is_waited_for_by_one_whose_clock_is_ahead(
    redis: Redis, unique: str, prefix: str
) -> None:
    """An inherited range of a live previous owner is its own, whatever the reader's clock."""
    a, b = _store(redis, prefix, unique), _store(redis, prefix, unique)
    tp = TopicPartition(f"clock_{unique}", 0)
    await a.take_claims({tp: (0, 100)})
    await a.live()
    assert await _skewed(b.claiming(tp, [a.instance])) == ([a.instance], [])


async def test_a_dead_member_is_taken_for_dead_by_one_whose_clock_is_behind(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A member whose liveness ran out by Redis's clock is dead to a reader whose clock lags."""
    a, b = _store(redis, prefix, unique), _store(redis, prefix, unique)
    a.live_ms = 1
    tp = TopicPartition(f"clock_{unique}", 0)
    await a.take_claims({tp: (0, 100)})
    await a.live()
    gone = (await redis.time())[0] + 1
    while (await redis.time())[0] <= gone:
        continue  # each turn asks Redis its time again
    assert await _skewed(b.claiming(tp, [a.instance]), -SKEW_S) == ([], [a.instance])


async def test_a_live_members_release_is_not_taken_over_by_one_whose_clock_is_ahead(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A release a live member holds (and renews) is not reaped by a member a minute ahead."""
    lane = guarded_lane(f"clock_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    for guard in (a, b):
        for store in guard._stores.values():
            store.lease_ms = 10_000
    handlers.outcomes[b"x"] = ["retried"]
    await a.run(lane, main_message(lane, 0, b"x"))
    await a.run(lane, main_message(lane, 1, b"y"))
    handlers.hold[b"y"] = asyncio.Event()
    head = asyncio.create_task(a.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    await a.tick({lane.name: lane})  # A lives on and renews its release
    await _skewed(b.tick({lane.name: lane}))
    assert not b._reaped
    handlers.hold.pop(b"y").set()
    assert await asyncio.wait_for(head, 10) == "handled"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("a", b"x"), ("a", b"x"), ("a", b"y")]
    await a.close()
    await b.close()

"""A key whose parking call got no answer stays known while the head's retry copy may park it.

The copy of a failed message is produced even when the call that parks its key got no answer
(the guard fails open). When the call never reached Redis, that copy parks the key itself once
it fails again from its tier, in whichever member reads the tier: the partition's owner is not
told. Its later first deliveries of the key must still ask Redis, and wait behind the copy.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import (
    Producer,
    main_message,
    parking_calls_time_out,
    retry_copy,
    routing_guard,
)
from runtime.helpers import join, lane_spec
from runtime.owned import prefix

from pipeline.envelope import Message
from pipeline.errors import Retry
from pipeline.retry.guard_store import lane_guards
from pipeline.retry.keys import encode_key
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime import claims as claims_module
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats

__all__ = ["prefix"]  # the fixture: a key prefix of the test's own, its keys deleted after


def half_hour_lane(name: str) -> Lane:
    """An ordered lane on one partition whose one retry tier waits 30 minutes."""
    app = App([lane_spec(name, 1, retry={"tiers": ["30m"], "max_attempts": 5})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        raise AssertionError("the handler stage is replaced in this test")

    return app.lanes[name]


def failing_copies(redis: Redis, prefix: str, lane: Lane) -> RunGuard:
    """Another member's guard, reading the lane's tier: every copy it runs fails again."""
    stats = Stats()
    routing = Redirector(RetryRouter(Producer()), stats, default_retryable, [lane])  # type: ignore[arg-type]

    async def stage(lane_: Lane, message: Message) -> str | None:
        return await routing.failure(lane_, message, 2, Retry("still failing"))

    stores = lane_guards(redis, prefix, [lane.spec])
    return RunGuard(stores, routing, stats, Isolation(5.0), stage, lambda *_: None)


async def test_a_key_whose_parking_got_no_answer_holds_followers_once_its_copy_parks_it(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 minutes after the failed call, the head's copy (due at 30) parks the key elsewhere.

    The head of key K fails on member A, which owns the partition; Redis does not answer the
    calls that park K (they never reach it), and the copy goes to its 30-minute tier. Past the
    20 minutes a call could still take to reach Redis, a reading of the parked keys does not
    find K. The copy then fails again in member B, which parks K. A reads K's next message:
    it must be held behind the copy. Before, the reading forgot K at 20 minutes, and the
    message ran at once on the claimed path, ahead of the copy of the message before it.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    lane = half_hour_lane(f"unsure_copy_{unique}")
    a, ran = routing_guard(redis, prefix, lane, b"x", claims=True)
    head = main_message(lane, 0, b"x0", key=b"K")
    follower = main_message(lane, 1, b"f1", key=b"K")
    await join(a, lane, [head, follower])
    store = a._stores[lane.name]

    parking_calls_time_out(monkeypatch, store)
    assert await a.run(lane, head) == "retried"  # its copy is in the tier; K is not parked
    monkeypatch.undo()
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    monkeypatch.setattr(claims_module, "UNSURE_KEPT_S", 0.0)  # the 20 minutes have passed
    claims = a._claims[lane.name]
    for n in range(3):  # other keys, past what the last reading kept: a reading at the tick
        claims.decided(f"other-{n}", "held")
    await a.tick({lane.name: lane})
    assert encode_key(b"K") not in await store.parked_keys()

    b = failing_copies(redis, prefix, lane)
    assert await b.run(lane, retry_copy(lane, 0, 0, b"x0", key=b"K")) == "retried"
    assert encode_key(b"K") in await store.parked_keys()  # B parked K behind A's back

    assert await a.run(lane, follower) == "parked"  # held behind the copy
    assert ran == [b"x0"]

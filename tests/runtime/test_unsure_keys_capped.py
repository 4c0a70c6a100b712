"""The keys of parking calls that got no answer are capped; past the cap, order still holds.

During a long outage with a flood of distinct keys, every failed parking call leaves its key
remembered for the lane's retry path (hours, or days on a lane with long tiers): without a cap
they all stayed. Past :data:`~pipeline.runtime.claims.UNSURE_KEPT_MAX` the oldest are let go,
and until their retry path is over no first delivery of the lane runs on the claimed path
here (each asks Redis), so a key let go still waits behind the copy that parks it.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import main_message, parking_calls_time_out, retry_copy, routing_guard
from runtime.helpers import join
from runtime.owned import prefix
from runtime.test_unsure_key_copy import failing_copies, half_hour_lane

from pipeline.retry.keys import encode_key
from pipeline.runtime import claims as claims_module

__all__ = ["prefix"]  # the fixture: a key prefix of the test's own, its keys deleted after


async def test_a_key_let_go_past_the_cap_still_waits_behind_its_copy(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two keys' parking calls get no answer, the cap is one: K is let go, yet held after.

    The heads of K and L fail on member A; Redis does not answer the calls that park them.
    With room for one such key, K's is let go when L's call fails; a reading of the parked
    keys then forgets K. K's copy fails again in member B, which parks K. A reads K's next
    message: it must be held behind the copy. Before, nothing bounded those keys (both were
    kept for the retry path); a cap that only let K go would run the message at once.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    monkeypatch.setattr(claims_module, "UNSURE_KEPT_MAX", 1, raising=False)
    lane = half_hour_lane(f"unsure_cap_{unique}")
    a, ran = routing_guard(redis, prefix, lane, b"x", claims=True)
    head_k = main_message(lane, 0, b"x0", key=b"K")
    head_l = main_message(lane, 1, b"x1", key=b"L")
    follower = main_message(lane, 2, b"f2", key=b"K")
    await join(a, lane, [head_k, head_l, follower])
    store = a._stores[lane.name]

    parking_calls_time_out(monkeypatch, store)
    assert await a.run(lane, head_k) == "retried"
    assert await a.run(lane, head_l) == "retried"
    monkeypatch.undo()
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    monkeypatch.setattr(claims_module, "UNSURE_KEPT_MAX", 1, raising=False)
    claims = a._claims[lane.name]
    assert len(claims._unsure) == 1  # L's; K's let go
    for n in range(3):  # other keys, past what the last reading kept: a reading at the tick
        claims.decided(f"other-{n}", "held")
    await a.tick({lane.name: lane})
    assert encode_key(b"K") not in (claims.maybe_parked or set())

    b = failing_copies(redis, prefix, lane)
    assert await b.run(lane, retry_copy(lane, 0, 0, b"x0", key=b"K")) == "retried"
    assert encode_key(b"K") in await store.parked_keys()  # B parked K behind A's back

    assert await a.run(lane, follower) == "parked"  # held behind the copy
    assert ran == [b"x0", b"x1"]

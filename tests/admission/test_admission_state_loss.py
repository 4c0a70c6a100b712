"""The throttle's settings after Redis lost its state (a restart without persistence, a flush).

The shared Redis is never flushed here: the namespace's own keys are deleted, which is what a
lost state looks like to the throttle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.reserve import ReserveSizer
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

HIGH, LOW = 10, 0


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle on a namespace of its own, default limit 4."""
    async with started_throttle(redis_service, namespace=f"s{unique}", default_limit=4) as limiter:
        yield limiter


async def _lose_the_state(t: Throttle) -> None:
    async for key in t.client.scan_iter(
        match=f"{k.tag(t.prefix, t.namespace)}*".replace("{", "\\{")
    ):
        await t.client.delete(key)


async def test_a_reserve_sizer_puts_the_reserve_back_after_redis_lost_it(
    throttle: Throttle,
) -> None:
    """The next resize sets the reserve again, though the plan has not changed.

    The sizer told the throttle only when the headroom changed, so after Redis lost its state
    the small tenants' reserve stayed gone for as long as their rates held steady: the flooder
    at a lower priority borrowed every slot again.
    """
    t = throttle
    sizer = ReserveSizer(t, "pool", slots=16, min_priority=HIGH)
    sized = await sizer.resize(arrival_per_s=70.5, service_s=0.0567, pool_service_s=0.0567)
    assert sized.headroom == 4  # docs/admission.md's worked example
    await t.set_limit("pool", 16)
    assert (await t.status("pool")).reserve == (sized.headroom, HIGH)
    await _lose_the_state(t)
    assert (await t.status("pool")).reserve is None
    await t.set_limit("pool", 16)  # the application's own setting, as it set it at start
    again = await sizer.resize(arrival_per_s=70.5, service_s=0.0567, pool_service_s=0.0567)
    assert again.headroom == sized.headroom
    assert (await t.status("pool")).reserve == (sized.headroom, HIGH)
    flood = [await t.try_acquire(["pool"], priority=LOW) for _ in range(16)]
    assert sum(p is not None for p in flood) == 16 - sized.headroom  # the reserve is kept again
    for permit in flood:
        if permit is not None:
            await t.release(permit)

"""The fleet's dynamic limits with many tenants of one message each, on a real Redis.

A tick's work is counted in round trips to Redis, never timed: it must not grow one round trip
per tenant, or a flood of one-message tenants stretches every tick past its interval.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio.connection import AbstractConnection
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

TENANTS = 2_000
POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys and limit stats live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"m{unique}", namespace="n") as limiter:
        yield limiter


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the writes redis-py makes to Redis (a pipeline is one)."""
    count = [0]
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: object, **kwargs: object) -> None:
        count[0] += 1
        await send(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return count


async def test_a_tick_with_many_one_message_tenants_takes_a_bounded_number_of_round_trips(
    throttle: Throttle, round_trips: list[int]
) -> None:
    """2,000 tenants of one job each: the tick sets every org's limit in a few round trips.

    Each org took three round trips of its own (its stats written, read back, its limit set),
    so 20,000 one-message tenants took 19 s a tick against an interval of 10 s, and a
    million would take a quarter of an hour, the limits of every other org waiting on them.
    The orgs' limits, and their removal once they went quiet, are the same as before.
    """
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, POLICY, member="a")
    fleet.bind(lambda: (1, 100))
    for i in range(TENANTS):
        fleet.submitted(f"tenant-{i}")
    fleet.finished("tenant-0", 1.0)
    now = 1_000_000.0
    before = round_trips[0]
    limits = await fleet.tick(now)
    assert round_trips[0] - before <= 60  # a few, not one per tenant
    assert limits is not None
    assert len(limits) == TENANTS
    assert set(limits.values()) == {8}  # base 2, ceiling 4, an idle fleet's factor 2
    limits_key = k.limits(throttle.prefix, throttle.namespace)
    assert await throttle.client.hlen(limits_key) == TENANTS
    assert (await throttle.status("org:tenant-1999")).limit == 8

    later = now + 60 * 60  # an hour without a job from any of them
    before = round_trips[0]
    assert await fleet.tick(later) == {}
    assert round_trips[0] - before <= 60
    assert await throttle.client.hlen(limits_key) == 0
    assert await throttle.client.zcard(k.orgs_seen(throttle.prefix)) == 0

"""The capped fleet tick reaches every org of the window, on a real Redis, as tenants come and go.

Beyond ``orgs_a_tick`` orgs in the stats window a tick sets a quarter of the cap for the orgs
with work in the throttle and a slice of the window for the rest. The slice started at rank
``tick * size % orgs seen``: the count changes whenever tenants arrive or leave, so the start
jumped to an unrelated rank at nearly every tick and a quiet org was reached at random, some
never in their whole window. The orgs with work came from the active keys in name order, cut
at the quarter: past it, the same first names every tick, and an org named later with work
waiting was never among them. Both now move on from where the last tick stopped.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from support import require_service

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits
from pipeline.admission.throttle import Permit, Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
INTERVAL_S = 10.0
NOW = 1_000_000.0


@pytest.fixture(params=["single", "cluster"])
async def throttle(
    request: pytest.FixtureRequest, redis_service: str, unique: str
) -> AsyncIterator[Throttle]:
    """A started throttle on the single Redis or the 3-node cluster, under a prefix of its own."""
    prefix = f"s{unique}"
    if request.param == "single":
        t = Throttle(Redis.from_url(redis_service), prefix=prefix, namespace="n")
    else:
        require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", 7000)
        url = "redis://127.0.0.1:7000"
        client, wake = RedisCluster.from_url(url), RedisCluster.from_url(url)
        t = Throttle(client, prefix=prefix, namespace="n", wake_client=wake)  # type: ignore[arg-type]
    try:
        await t.start()
        yield t
    finally:
        await t.close()
        if request.param == "cluster":  # the single Redis's keys go with ``unique``
            async for key in t.client.scan_iter(match=f"*{prefix}*", count=1000):
                await t.client.delete(key)
        await t.client.aclose()


def _fleet(throttle: Throttle, member: str, cap: int, load: tuple[int, int]) -> FleetLimits:
    fleet = FleetLimits(
        throttle.client,
        throttle.prefix,
        throttle,
        POLICY,
        member=member,
        interval_s=INTERVAL_S,
        orgs_a_tick=cap,
    )
    fleet.bind(lambda: load)
    return fleet


async def test_every_quiet_org_is_reached_within_a_pass_while_tenants_come_and_go(
    throttle: Throttle,
) -> None:
    """2,000 quiet orgs, a few new ones every tick: each reached within one pass of the slice.

    The flood is counted by another member, so the recomputing one reaches it only through
    the slice (150 orgs a tick: a pass over some 2,100 orgs is 15 ticks).
    """
    cap, flood = 300, 2_000
    leader = _fleet(throttle, "a", cap, (1, 100))
    other = _fleet(throttle, "b", cap, (1, 100))
    for i in range(flood):
        other.submitted(f"flood-{i}")
    await leader.tick(NOW)  # wins tick 0: nothing of its own yet
    await other.tick(NOW + 0.5)  # tick 0 taken: reports the flood only
    slice_size = cap - 2 * (cap // 4)
    ticks = math.ceil((flood + 200) / slice_size) + 1
    reached: set[str] = set()
    for tick in range(1, ticks + 1):
        for j in range(tick % 7 + 1):  # a few new tenants a tick, never the same count
            leader.submitted(f"new-{tick}-{j}")
        got = await leader.tick(NOW + tick * INTERVAL_S)
        assert got is not None
        assert len(got) <= cap
        reached |= set(got)
    missed = sorted(f"flood-{i}" for i in range(flood) if f"flood-{i}" not in reached)
    assert not missed, f"{len(missed)} of {flood} quiet orgs never reached in {ticks} ticks"


async def test_every_org_with_work_waiting_follows_the_pressure_within_a_few_ticks(
    throttle: Throttle,
) -> None:
    """30 quiet orgs holding work, a quarter of 10 a tick: each recomputed within 3 ticks.

    ``zz-*`` sort after the flood's names and the first holders: cut at the quarter in name
    order, they were never among the orgs with work, left to the slice (100 ticks a pass).
    """
    cap, flood, holders = 40, 2_000, 30
    share = cap // 4
    fleet = _fleet(throttle, "a", cap, (1, 100))
    names = [f"aa-{i}" for i in range(holders - 5)] + [f"zz-{i}" for i in range(5)]
    for name in names:
        fleet.submitted(name)
    for i in range(flood):
        fleet.submitted(f"flood-{i}")
    await fleet.tick(NOW)
    permits: list[Permit] = [await throttle.acquire([f"org:{name}"]) for name in names]
    over = _fleet(throttle, "a", cap, (400, 100))  # over-committed: the least factor
    try:
        reached: set[str] = set()
        for tick in range(1, math.ceil(holders / share) + 1):
            got = await over.tick(NOW + tick * INTERVAL_S)
            assert got is not None
            reached |= {org for org in names if org in got}
            for org in names:
                if org in got:
                    assert got[org] == 2  # floor 2: ceiling 4 times 0.25, floored at 2
        assert sorted(set(names) - reached) == []
        limits = k.limits(throttle.prefix, throttle.namespace)
        for name in names:
            assert int(await throttle.client.hget(limits, f"org:{name}") or 0) == 2, name
    finally:
        for permit in permits:
            await throttle.release(permit)

"""The fleet tick under a flood of distinct tenants, on a real Redis: bounded work a tick.

A producer sending every message with a new ``pl-tenant`` leaves a hundred thousand orgs seen
in the stats window. The tick recomputed every one of them at every tick for the six minutes
of the window (100,000 orgs: 6 to 10 s of a 10 s interval, a thousand Redis calls and 10 MB a
tick, each org's limit reset 36 times), so every other tenant's admissions queued behind it in
Redis. A tick now works on a bounded number of orgs: the ones with work in the throttle, then
the ones seen lately, then a slice of the quiet rest, so every org of the window still gets its
limit within a few ticks. Work is counted in orgs read and commands sent, never timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from admission.capped_fleet import capped_fleet
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
FLOOD = 2_000
CAP = 300
INTERVAL_S = 10.0
NOW = 1_000_000.0


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys and limit stats live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"f{unique}", namespace="n") as limiter:
        yield limiter


def _fleet(throttle: Throttle, load: list[tuple[int, int]]) -> FleetLimits:
    return capped_fleet(throttle, POLICY, load, cap=CAP, interval_s=INTERVAL_S)


async def _flooded(throttle: Throttle, fleet: FleetLimits) -> None:
    """FLOOD one-message tenants seen at NOW, their first tick done."""
    for i in range(FLOOD):
        fleet.submitted(f"flood-{i}")
    await fleet.tick(NOW)


async def test_a_tick_after_a_flood_of_tenants_recomputes_a_bounded_number_of_orgs(
    throttle: Throttle, commands: list[int]
) -> None:
    """Ticks after the flood touch at most the cap of orgs, the real tenant first every time.

    The flood's orgs are quiet but in the window: each tick recomputes a slice of them, and in
    a few ticks every one has had its limit set, as the docs promise for every org seen.
    """
    load = [(1, 100)]
    fleet = _fleet(throttle, load)
    await _flooded(throttle, fleet)
    limits_key = k.limits(throttle.prefix, throttle.namespace)
    covered: set[str] = set()
    for tick in range(1, 16):  # a slice of half the cap a tick: 2,001 orgs in 14
        for _ in range(5):
            fleet.submitted("acme")  # a real tenant, busy every tick
        before = commands[0]
        got = await fleet.tick(NOW + tick * INTERVAL_S)
        assert got is not None
        assert len(got) <= CAP, f"tick {tick}"  # not every org of the window
        assert "acme" in got
        assert commands[0] - before <= 40  # a few, not some per org of the window
        covered |= set(got)
    assert covered == {"acme", *(f"flood-{i}" for i in range(FLOOD))}
    assert await throttle.client.hlen(limits_key) == FLOOD + 1


async def test_an_org_with_work_waiting_is_recomputed_every_tick_of_a_flood(
    throttle: Throttle,
) -> None:
    """An org quiet since the flood but holding work in the throttle follows the pressure."""
    load = [(1, 100)]
    fleet = _fleet(throttle, load)
    fleet.submitted("backlog")
    await _flooded(throttle, fleet)
    permit = await throttle.acquire(["org:backlog"])
    try:
        load[0] = (400, 100)  # over-committed: every ceiling shrinks to the least factor
        for tick in range(1, 4):
            got = await fleet.tick(NOW + tick * 3 * INTERVAL_S)  # backlog quiet since NOW
            assert got is not None
            assert got["backlog"] == 2  # floor 2: ceiling 4 times 0.25, floored at 2
        assert (await throttle.status("org:backlog")).limit == 2
    finally:
        await throttle.release(permit)


async def test_orgs_gone_quiet_are_removed_a_bounded_number_a_tick(
    throttle: Throttle, commands: list[int]
) -> None:
    """The window past, the flood's orgs go back to the default limit a capped batch a tick."""
    load = [(1, 100)]
    fleet = _fleet(throttle, load)
    await _flooded(throttle, fleet)
    for tick in range(1, 16):  # every org's limit set once
        await fleet.tick(NOW + tick * INTERVAL_S)
    limits_key = k.limits(throttle.prefix, throttle.namespace)
    seen = k.orgs_seen(throttle.prefix)
    assert await throttle.client.hlen(limits_key) == FLOOD
    later = NOW + 3_600
    left = FLOOD
    for tick in range(FLOOD // CAP + 1):
        before = commands[0]
        assert await fleet.tick(later + tick * INTERVAL_S) == {}
        assert commands[0] - before <= 40
        now_left = await throttle.client.zcard(seen)
        assert now_left >= left - CAP
        left = now_left
    assert left == 0
    assert await throttle.client.hlen(limits_key) == 0

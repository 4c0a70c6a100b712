"""A ``pl-tenant`` over a kilobyte with work in the throttle, beyond the tick's cap of orgs.

Its throttle key is named by its head and digest (:func:`~pipeline.admission.keys.key_text`).
Above ``orgs_a_tick`` orgs in the window a tick sets a quarter of its cap from the orgs with
work (the active keys): named in the window by its ``pl-tenant`` in full, such an org was never
found among them, so it was set only when the moving slice reached it, and its waiters got the
room a grown factor gave only at a release. The window names it as its key does
(:func:`~pipeline.admission.keys.org_name`). The cap is lowered to a few dozen orgs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from admission.capped_fleet import capped_fleet
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import WINDOW_MIN, LimitPolicy, OrgLimits
from pipeline.admission.throttle import Permit, Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(
    defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25, f_max=2.0
)
CAP = 40
FLOOD = 400
INTERVAL_S = 10.0
NOW = 1_000_000.0
LONG = "z" * 2_000
"""Over the kilobyte, and named after every flood org, so the slice does not reach it soon."""
IDLE = (0, 100)
SQUEEZED = (1_000, 100)


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys and limit stats live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"w{unique}", namespace="n") as limiter:
        yield limiter


def _fleet(throttle: Throttle, load: list[tuple[int, int]]) -> FleetLimits:
    return capped_fleet(throttle, POLICY, load, cap=CAP, interval_s=INTERVAL_S)


def _flooded(fleet: FleetLimits) -> None:
    """The long org once, each flood org more often (so the long one is no most-counted)."""
    fleet.submitted(LONG)
    for i in range(FLOOD):
        for _ in range(3):
            fleet.submitted(f"flood-{i:04}")


def _reached(limits: object) -> bool:
    """Whether a tick's limits name the long org (by whichever name it keeps in the window)."""
    assert isinstance(limits, dict)
    return any(k.key_text(f"org:{org}") == k.key_text(f"org:{LONG}") for org in limits)


async def _hold(throttle: Throttle, key: str, count: int) -> list[Permit]:
    permits = [await throttle.try_acquire([key]) for _ in range(count)]
    assert all(permits)
    return [permit for permit in permits if permit is not None]


async def test_a_long_named_org_with_work_is_set_at_every_capped_tick(throttle: Throttle) -> None:
    """Holding its slots, the org is among the busy quarter of each tick, not left to the slice.

    Before, the busy quarter compared the active keys' names with the window's, never matching
    the long org: the four ticks set 160 orgs and it was none of them.
    """
    load = [IDLE]
    fleet = _fleet(throttle, load)
    _flooded(fleet)
    key = f"org:{LONG}"
    permits = await _hold(throttle, key, 2)
    try:
        for tick in range(4):
            limits = await fleet.tick(NOW + tick * INTERVAL_S)
            assert limits is not None
            assert len(limits) <= CAP
            assert _reached(limits), tick
    finally:
        for permit in permits:
            await throttle.release(permit)


@pytest.mark.parametrize("tenant", ["zz-short", LONG])
async def test_waiters_get_the_room_a_grown_factor_gives_at_the_next_tick(
    throttle: Throttle, tenant: str
) -> None:
    """Squeezed to 2, both slots held and a job waiting: the fleet idles, its job is admitted.

    The factor alone grew the org's limit (8 now); no holder releases. The tick sets the org
    (it has work) and its new room goes to the waiter. Before, a long-named org was left to
    the slice: not set at the squeezed tick, and its waiter not served at the idle one.
    """
    load = [SQUEEZED]
    fleet = _fleet(throttle, load)
    _flooded(fleet)
    fleet.submitted(tenant)
    key = f"org:{tenant}"
    permits = await _hold(throttle, key, 2)
    waiting: asyncio.Future[Permit] | None = None
    try:
        assert await fleet.tick(NOW) is not None
        assert (await throttle.status(key)).limit == 2
        waiting = asyncio.ensure_future(throttle.acquire([key]))
        async with asyncio.timeout(30):  # the job waits once its first call returned
            while not (await throttle.status(key)).waiters:  # each try is a round trip
                pass
        load[0] = IDLE
        assert await fleet.tick(NOW + INTERVAL_S) is not None
        status = await throttle.status(key)
        assert status.limit == 8
        assert status.waiters == ()
        permits.append(await asyncio.wait_for(waiting, 10))
    finally:
        if waiting is not None:
            waiting.cancel()
        for permit in permits:
            await throttle.release(permit)


async def test_a_long_tenant_is_a_short_member_of_the_window_and_its_key_is_limited(
    throttle: Throttle,
) -> None:
    """A 256 KiB ``pl-tenant``: named by head and digest in the window, limited, then forgotten."""
    tenant = "t" * (256 * 1024)
    key = f"org:{tenant}"
    load = [SQUEEZED]
    fleet = _fleet(throttle, load)
    fleet.submitted(tenant)
    fleet.finished(tenant, 0.5)
    await fleet.tick(NOW)

    seen = await throttle.client.zrange(k.orgs_seen(throttle.prefix), 0, -1)
    assert len(seen) == 1
    assert len(seen[0]) <= 328
    assert f"org:{seen[0].decode()}" == k.key_text(key)
    assert await throttle.client.exists(k.limit_stats(throttle.prefix, k.org_name(tenant)))
    assert (await throttle.status(key)).limit == 2

    await fleet.tick(NOW + (WINDOW_MIN + 2) * 60)  # gone for the window: back to the default
    assert await throttle.client.zcard(k.orgs_seen(throttle.prefix)) == 0
    assert (await throttle.status(key)).limit == throttle.default_limit

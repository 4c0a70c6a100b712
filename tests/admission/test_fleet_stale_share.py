"""A quiet org's stale limit against the fleet's current factor, beyond the tick's cap of orgs.

Above ``orgs_a_tick`` orgs in the stats window a tick sets only some of their limits: a quiet
org keeps the limit its last tick gave it until the moving slice reaches it again. Set while
the fleet was idle (factor f_max) and read once the fleet is over-committed (factor f_min),
that limit let the org run at f_max / f_min (8) times its share. Admission now applies the
fleet's current factor to the org's own part (its ceiling, floor and dedicated capacity), so a
limit the tick did not reach still shrinks with everyone's. The cap is lowered to a few dozen
orgs (``orgs_a_tick``, the fleet's own seam) so the window overflows with a few hundred orgs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import pytest
from admission.capped_fleet import capped_fleet
from support import all_admitted, started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits, dynamic_limit
from pipeline.admission.shares import Share
from pipeline.admission.throttle import Permit, Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(
    defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25, f_max=2.0
)
CAP = 40
FLOOD = 400
INTERVAL_S = 10.0
NOW = 1_000_000.0
QUIET = "a-quiet"
"""Named first, so the first capped tick's slice reaches it and the next ones move past it."""
IDLE = (0, 100)
SQUEEZED = (1_000, 100)
"""1,000 handlers running against 80 slots targeted: the factor is f_min."""


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys and limit stats live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"s{unique}", namespace="n") as limiter:
        yield limiter


def _fleet(throttle: Throttle, load: list[tuple[int, int]]) -> FleetLimits:
    return capped_fleet(throttle, POLICY, load, cap=CAP, interval_s=INTERVAL_S)


def _share(in_flight: int) -> int:
    """A quiet org's share at ``in_flight`` handlers running (no traffic: its floor's ceiling)."""
    return dynamic_limit(
        POLICY.defaults,
        rate_per_min=0.0,
        duration_s=0.0,
        pool_target=80,
        in_flight=in_flight,
        f_min=POLICY.f_min,
        f_max=POLICY.f_max,
    )


def _admitted(throttle: Throttle, key: str) -> AbstractAsyncContextManager[list[Permit]]:
    """Permits ``try_acquire`` grants on ``key`` until it refuses (a bound far above 8)."""
    return all_admitted(throttle, key, 20)


async def test_a_quiet_org_the_tick_did_not_reach_is_admitted_only_to_its_current_share(
    throttle: Throttle,
) -> None:
    """Its limit set while the fleet idled, the fleet squeezed: it gets the squeezed share.

    Before, the org kept the idle limit (8 where its share was 2) until the slice came back.
    """
    load = [IDLE]
    fleet = _fleet(throttle, load)
    fleet.submitted(QUIET)
    for i in range(FLOOD):
        fleet.submitted(f"flood-{i:04}")
    first = await fleet.tick(NOW)
    assert first is not None
    assert first[QUIET] == _share(0) == 8  # reached at the idle factor, f_max

    load[0] = SQUEEZED
    later = await fleet.tick(NOW + INTERVAL_S)
    assert later is not None
    assert QUIET not in later  # the slice moved past it: its limit hash entry is still 8
    assert len(later) <= CAP
    stored = await throttle.client.hget(k.limits(throttle.prefix, "n"), f"org:{QUIET}")
    assert stored == b"8"

    async with _admitted(throttle, f"org:{QUIET}") as permits:
        assert len(permits) == _share(1_000) == 2
        assert (await throttle.status(f"org:{QUIET}")).limit == 2


async def test_a_fleet_with_room_again_gives_a_quiet_org_its_grown_share(
    throttle: Throttle,
) -> None:
    """Set while the fleet was squeezed, a limit grows with the factor before the tick is back."""
    load = [SQUEEZED]
    fleet = _fleet(throttle, load)
    fleet.submitted(QUIET)
    for i in range(FLOOD):
        fleet.submitted(f"flood-{i:04}")
    first = await fleet.tick(NOW)
    assert first is not None
    assert first[QUIET] == 2

    load[0] = IDLE
    later = await fleet.tick(NOW + INTERVAL_S)
    assert later is not None
    assert QUIET not in later

    async with _admitted(throttle, f"org:{QUIET}") as permits:
        assert len(permits) == 8


async def test_without_the_factor_key_the_limits_last_set_apply(throttle: Throttle) -> None:
    """The factor key gone (a first tick after an upgrade, a fleet stopped): stored limits rule."""
    load = [IDLE]
    fleet = _fleet(throttle, load)
    fleet.submitted(QUIET)
    await fleet.tick(NOW)
    load[0] = SQUEEZED
    await fleet.tick(NOW + INTERVAL_S)  # not capped: sets the quiet org at the squeezed factor
    await throttle.client.delete(k.fleet_factor(throttle.prefix, "n"))

    async with _admitted(throttle, f"org:{QUIET}") as permits:
        assert len(permits) == 2  # the limits hash entry the last tick wrote

    await throttle.set_limits({"org:set-by-hand": 3})  # no share: a plain limit, as before
    async with _admitted(throttle, "org:set-by-hand") as permits:
        assert len(permits) == 3


async def test_a_limit_an_operator_sets_overrides_the_orgs_share(throttle: Throttle) -> None:
    """``set_limit`` on an org the fleet set: the operator's limit, whatever the factor."""
    load = [IDLE]
    fleet = _fleet(throttle, load)
    fleet.submitted(QUIET)
    await fleet.tick(NOW)
    await throttle.set_limit(f"org:{QUIET}", 5)

    async with _admitted(throttle, f"org:{QUIET}") as permits:
        assert len(permits) == 5
        assert (await throttle.status(f"org:{QUIET}")).limit == 5


@pytest.mark.parametrize("factor", [80 / 97, 80 / 333, 0.8, 1.3, 80 / 61])
async def test_admission_and_status_compute_a_share_as_the_tick_does(
    throttle: Throttle, factor: float
) -> None:
    """Lua's limit from a share and a factor is :meth:`Share.limit`'s, at factors no power of 2."""
    shares = {f"org:c{top}": Share(top, 1, 1) for top in (3, 7, 10, 13)}
    await throttle.set_shares({key: (0, share) for key, share in shares.items()})
    await throttle.set_factor(factor, ttl_ms=60_000)
    for key, share in shares.items():
        async with _admitted(throttle, key) as permits:
            assert len(permits) == share.limit(factor)
            assert (await throttle.status(key)).limit == share.limit(factor)

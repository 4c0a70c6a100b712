"""The dynamic limits of one member over a throttle, with the orgs set a tick capped, for tests."""

from __future__ import annotations

from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy
from pipeline.admission.throttle import Throttle


def capped_fleet(
    throttle: Throttle,
    policy: LimitPolicy,
    load: list[tuple[int, int]],
    *,
    cap: int,
    interval_s: float,
) -> FleetLimits:
    """Member ``a``'s :class:`FleetLimits` setting at most ``cap`` orgs a tick.

    ``load[0]`` is its (handlers running, slots targeted) at each tick: a test changes it between
    ticks to squeeze or free the fleet.
    """
    fleet = FleetLimits(
        throttle.client,
        throttle.prefix,
        throttle,
        policy,
        member="a",
        interval_s=interval_s,
        orgs_a_tick=cap,
    )
    fleet.bind(lambda: load[0])
    return fleet

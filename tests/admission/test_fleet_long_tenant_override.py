"""A per-org override of a ``pl-tenant`` over a kilobyte, stored under the tenant as sent.

The dynamic limits name such an org by its throttle key's name (head and digest,
:func:`~pipeline.admission.keys.org_name`); the previous release named it, and looked its
override up, by the ``pl-tenant`` in full, which is also what an operator types. An override
stored so applies to it still, as one stored under the org's head-and-digest name does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits, store_org_override
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(
    defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25, f_max=2.0
)
LONG = "q" * 2_000
SQUEEZED = (1_000, 100)
"""A fleet over its target: the factor is f_min, every org at its floor (plus dedicated)."""


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys, stats and overrides live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"o{unique}", namespace="n") as limiter:
        yield limiter


async def _ticked_limit(throttle: Throttle, policy: LimitPolicy, tenant: str) -> int:
    fleet = FleetLimits(
        throttle.client, throttle.prefix, throttle, policy, member="a", interval_s=10.0
    )
    fleet.bind(lambda: SQUEEZED)
    fleet.submitted(tenant)
    assert await fleet.tick(1_000_000.0) is not None
    return (await throttle.status(f"org:{tenant}")).limit


@pytest.mark.parametrize("stored_as", ["tenant", "org_name"])
async def test_an_override_in_redis_applies_to_a_long_tenant(
    throttle: Throttle, stored_as: str
) -> None:
    """Floor 9, 3 dedicated: 12 under pressure. Before, one under the tenant in full gave 2."""
    name = LONG if stored_as == "tenant" else k.org_name(LONG)
    await store_org_override(
        throttle.client, throttle.prefix, name, OrgLimits(floor=9, dedicated=3)
    )
    assert await _ticked_limit(throttle, POLICY, LONG) == 12


async def test_a_policy_file_override_applies_to_a_long_tenant(throttle: Throttle) -> None:
    """The policy's ``orgs`` name the tenant in full, as YAML written for the last release did."""
    policy = POLICY.model_copy(update={"orgs": {LONG: OrgLimits(floor=5)}})
    assert await _ticked_limit(throttle, policy, LONG) == 5


async def test_an_org_of_the_previous_release_in_the_window_finds_either_override(
    throttle: Throttle,
) -> None:
    """A member of the previous release puts the tenant in full in the window: either name fits."""
    policy = POLICY.model_copy(update={"orgs": {k.org_name(LONG): OrgLimits(floor=6)}})
    assert policy.for_org(LONG).floor == 6
    assert policy.for_org(k.org_name(LONG)).floor == 6
    assert policy.for_org("short").floor == 2


def test_overrides_laid_over_a_policy_already_asked_apply() -> None:
    """``load_org_overrides`` copies the policy with new ``orgs``: those are the ones read."""
    assert POLICY.for_org(k.org_name(LONG)).floor == 2
    copied = POLICY.model_copy(update={"orgs": {LONG: OrgLimits(floor=4)}})
    assert copied.for_org(k.org_name(LONG)).floor == 4
    assert POLICY.for_org(k.org_name(LONG)).floor == 2

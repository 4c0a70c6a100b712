"""A fleet share beside members of an earlier release, which know limits but no shares.

While a rolling upgrade (or a rollback) runs both releases, a member of the earlier one may win
a tick and forget a gone org: its ``thr_set_limits`` clears the org's ``T:limits`` entry and
knows nothing of ``T:shares``. The share left behind must not keep limiting the org while the
fleet's factor is set: the org is back to the default, as the earlier release meant.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import all_admitted, started_throttle

from pipeline.admission import keys as k
from pipeline.admission.shares import Share
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

KEY = "org:gone"


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys live under a prefix of its own."""
    async with started_throttle(redis_service, prefix=f"e{unique}", namespace="n") as limiter:
        yield limiter


async def _admitted(throttle: Throttle, key: str) -> int:
    """How many permits ``try_acquire`` grants on ``key`` (all released again)."""
    async with all_admitted(throttle, key, 3 * throttle.default_limit) as permits:
        return len(permits)


async def test_a_limit_an_earlier_release_cleared_takes_the_share_with_it(
    throttle: Throttle,
) -> None:
    """Set by this release at a factor of 0.5 (2), cleared by an earlier one: the default.

    Before, the share stayed in force for as long as the fleet set its factor: 2, not 10.
    """
    await throttle.set_shares({KEY: (2, Share(4, 2, 0))})
    await throttle.set_factor(0.5, ttl_ms=60_000)
    assert await _admitted(throttle, KEY) == 2

    # An earlier release's thr_set_limits of (KEY, ""): HDEL of T:limits, T:shares untouched.
    await throttle.client.hdel(k.limits(throttle.prefix, "n"), KEY)

    assert throttle.default_limit == 10
    assert (await throttle.status(KEY)).limit == 10
    assert await _admitted(throttle, KEY) == 10

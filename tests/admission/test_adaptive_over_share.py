"""An adaptive key that also holds a fleet share: the window, not the share, is its limit.

``thr_acquire`` applies a key's share at the fleet's factor whenever the key has a limit, so a
share left beside an adaptive key's limit would override the window, and a Retry-After's
closing (limit 0) with it. Feedback on the key drops its share.
"""

from __future__ import annotations

import pytest
from support import own_throttle

from pipeline.admission.adaptive import feedback_for
from pipeline.admission.shares import Share
from pipeline.admission.throttle import Throttle
from pipeline.topics.spec import AdaptivePolicy

pytestmark = pytest.mark.redis

POLICY = AdaptivePolicy.model_validate({"min": 1, "max": 8, "cooldown": "1h"})
KEY = "org:acme"

throttle = own_throttle(default_limit=2)
"""A started throttle in a namespace of the test's own."""


async def test_a_retry_after_closes_a_key_with_a_share(throttle: Throttle) -> None:
    """Closed by a Retry-After, a key with a share at factor 2 (limit 8) admits nothing."""
    await throttle.set_shares({KEY: (4, Share(ceiling=4, floor=1, dedicated=0))})
    await throttle.set_factor(2.0, ttl_ms=60_000)
    assert (await throttle.status(KEY)).limit == 8  # the share at the factor now
    permit = await throttle.acquire([KEY])
    feedback = feedback_for(
        [KEY], {KEY: POLICY}, duration_s=0.1, throttled=True, retry_after_s=3600
    )
    await throttle.release(permit, feedback)
    assert (await throttle.status(KEY)).limit == 0
    assert await throttle.try_acquire([KEY]) is None

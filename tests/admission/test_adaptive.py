"""Adaptive limits for downstream quotas: AIMD on a throttle key, shared through Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from pipeline.admission.adaptive import Feedback, feedback_for
from pipeline.admission.throttle import Throttle
from pipeline.topics.spec import AdaptivePolicy, ThrottlePolicy

pytestmark = pytest.mark.redis

DEP = "dep:vision-api"
POLICY = AdaptivePolicy.model_validate({"min": 1, "max": 8, "latency": "2s", "cooldown": "1h"})


@pytest.fixture
async def throttles(redis_service: str, unique: str) -> AsyncIterator[Callable[[], Throttle]]:
    """Started throttles (members) on one namespace, closed at the end."""
    made: list[Throttle] = []

    async def build() -> Throttle:
        # Leases of a minute: heartbeats every 20 s, so none of them reopens a key in a test.
        t = Throttle(
            Redis.from_url(redis_service), namespace=f"a{unique}", default_limit=4, lease_ms=60_000
        )
        await t.start()
        made.append(t)
        return t

    yield build  # type: ignore[misc]
    for t in made:
        await t.close()
        await t.client.aclose()


async def _run(t: Throttle, feedback: Feedback) -> None:
    permit = await t.acquire([DEP])
    await t.release(permit, [feedback])


async def test_successes_grow_the_window_additively_up_to_max(throttles) -> None:
    """Each success adds 1/window: about a slot per window of successes; never above max."""
    t = await throttles()
    limits = []
    for _ in range(6):  # the window starts at the key's limit (the default, 4)
        await _run(t, Feedback(DEP, "ok", POLICY))
        limits.append((await t.status(DEP)).limit)
    assert limits == [4, 4, 4, 4, 5, 5]  # 4.25, 4.49, 4.71, 4.92, 5.12, 5.32
    for _ in range(200):
        await _run(t, Feedback(DEP, "ok", POLICY))
    assert (await t.status(DEP)).limit == 8


async def test_a_throttled_call_halves_the_window_once_per_cooldown(throttles) -> None:
    """Several 429s of one congestion event (jobs in flight together) cut the window once."""
    a, b = await throttles(), await throttles()  # two members share the key's state
    for _ in range(3):
        await _run(a, Feedback(DEP, "throttled", POLICY))
        await _run(b, Feedback(DEP, "throttled", POLICY))
    assert (await a.status(DEP)).limit == 2  # 4 * 0.5, once


async def test_slow_calls_shrink_the_window_to_min(throttles) -> None:
    """A call over the latency target counts as congestion; the window stops at min."""
    t = await throttles()
    quick = AdaptivePolicy.model_validate({"min": 3, "max": 8, "cooldown": "1ms"})
    limits = []
    for _ in range(5):
        await _run(t, Feedback(DEP, "slow", quick))
        limits.append((await t.status(DEP)).limit)
    assert limits == [3] * 5  # 4 * 0.5 = 2, held at min


async def test_retry_after_closes_the_key_then_it_reopens_to_waiters(throttles) -> None:
    """No job takes the key until the Retry-After has passed; then waiters get it in order."""
    t = await throttles()
    permit = await t.acquire([DEP])
    await t.release(permit, [Feedback(DEP, "throttled", POLICY, retry_after_ms=300)])
    status = await t.status(DEP)
    assert status.limit == 0
    assert await t.try_acquire([DEP]) is None
    waiter = asyncio.create_task(t.acquire([DEP]))
    granted = await asyncio.wait_for(waiter, 10)  # when due, not at a heartbeat (20 s here)
    assert (await t.status(DEP)).limit == 2  # the window after the cut
    await t.release(granted)


async def test_set_limit_restarts_an_adaptive_window_and_opens_the_key(throttles) -> None:
    """An operator's set-limit wins over a closed key and the window continues from it."""
    t = await throttles()
    permit = await t.acquire([DEP])
    await t.release(permit, [Feedback(DEP, "throttled", POLICY, retry_after_ms=3_600_000)])
    await t.set_limit(DEP, 6)
    assert (await t.status(DEP)).limit == 6
    for _ in range(7):  # 6 + 1/6 + ... passes 7 on the seventh success
        await _run(t, Feedback(DEP, "ok", POLICY))
    assert (await t.status(DEP)).limit == 7


def test_feedback_is_given_to_the_adaptive_keys_a_job_held() -> None:
    """Throttled blames the named dependency (or all); slow and ok follow the latency target."""
    adaptive = {DEP: POLICY, "dep:ocr": POLICY}
    keys = ["org:acme", DEP, "dep:ocr"]
    outcomes = feedback_for(keys, adaptive, duration_s=0.1, throttled=False)
    assert [(f.key, f.outcome) for f in outcomes] == [(DEP, "ok"), ("dep:ocr", "ok")]
    slow = feedback_for(keys, adaptive, duration_s=3.0, throttled=False)
    assert {f.outcome for f in slow} == {"slow"}
    one = feedback_for(
        keys, adaptive, duration_s=0.1, throttled=True, retry_after_s=1.5, dependency="ocr"
    )
    assert [(f.key, f.outcome, f.retry_after_ms) for f in one] == [
        (DEP, "ok", 0),
        ("dep:ocr", "throttled", 1500),
    ]
    both = feedback_for(keys, adaptive, duration_s=0.1, throttled=True)
    assert {f.outcome for f in both} == {"throttled"}


def test_an_adaptive_key_must_be_a_plain_key_of_the_policy() -> None:
    """A key the lane does not hold, or a template, is refused with the reason."""
    with pytest.raises(ValidationError, match="must be one of the plain"):
        ThrottlePolicy.model_validate({"keys": ["org:{tenant}"], "adaptive": {DEP: {"max": 4}}})
    with pytest.raises(ValidationError, match="must be one of the plain"):
        ThrottlePolicy.model_validate(
            {"keys": ["dep:{tenant}"], "adaptive": {"dep:{tenant}": {"max": 4}}}
        )
    with pytest.raises(ValidationError, match="above max"):
        AdaptivePolicy.model_validate({"min": 5, "max": 4})

"""The capacity plan just after UTC midnight, when the lane had no arrivals the day before."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.capacity.history import MINUTES_PER_DAY, ArrivalHistory
from pipeline.capacity.plan import plan_lane
from pipeline.capacity.settings import CapacitySettings

DAY = 20_001
NOW_MIN = DAY * MINUTES_PER_DAY + 10  # 00:10 UTC
NOW_S = NOW_MIN * 60.0


@pytest.fixture
async def history(redis: Redis, unique: str) -> AsyncIterator[ArrivalHistory]:
    """A lane's history under a prefix of this test; its keys are deleted afterwards."""
    prefix = f"t{unique}"
    yield ArrivalHistory(redis, prefix)
    found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
    if found:
        await redis.delete(*found)


async def test_arrivals_since_midnight_count_when_the_day_before_had_none(
    history: ArrivalHistory,
) -> None:
    """A quiet day leaves no key: today's arrivals still make the rate, not zero."""
    await history.add_once(
        "test",
        [(1, {("messages", m): 600 for m in range(DAY * MINUTES_PER_DAY, NOW_MIN)})],
        settled={},
    )
    settings = CapacitySettings(default_service_s=1.0, min_members=1)
    plan = await plan_lane(history, "messages", settings, slots_per_member=4, now_s=NOW_S)
    assert plan.rate_per_s == pytest.approx(10.0)
    assert plan.forecast.peak_per_s == pytest.approx(600 * 10 / 15 / 60)
    assert plan.desired_members == 4  # ceil(10/s x 1 s / (4 slots x 0.7))

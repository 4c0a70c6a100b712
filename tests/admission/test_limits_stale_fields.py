"""``lim_record`` deletes the stale minutes an org's stats still hold, and looks up no others.

Each write deletes the ten minutes before the stats window, thirty fields, from every org it
counts. Nearly all of them are long gone (the write before deleted them), yet an ``HDEL`` of all
thirty searched each org's hash for each of them: half of a call's time, during which Redis
serves no other client. The stats left behind are the same either way
(``test_fleet_batched_tick.py`` compares them with the code before batching); here the work is
counted in the commands Redis runs, on a redis-server of the test's own, never timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.redis_server import command_calls, private_client
from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.limits import ORGS_A_CALL, WINDOW_MIN, LimitTracker

pytestmark = pytest.mark.redis

ORGS = ORGS_A_CALL + 20  # two calls
PREFIX = "stale"
START_S = 1_000_000 * 60.0  # the start of a minute


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[Redis]:
    """A client of a redis-server of this test's own: its command counts are the test's alone."""
    async with private_client(tmp_path / "redis") as client:
        yield client


def _orgs() -> list[str]:
    return [f"org-{i}" for i in range(ORGS)]


async def _tick(tracker: LimitTracker, at_s: float) -> None:
    """Every org submits two jobs and finishes one, at ``at_s``."""
    await tracker.record_many({org: (2, [1.5]) for org in _orgs()}, now_s=at_s)


async def _minutes(client: Redis, org: str) -> set[int]:
    """The minutes ``org``'s stats hold a field of."""
    fields: list[bytes] = await client.hkeys(k.limit_stats(PREFIX, org))  # type: ignore[assignment]
    return {int(f.partition(b":")[2]) for f in fields}


async def test_a_write_deletes_no_field_where_no_stale_minute_is_left(private: Redis) -> None:
    """Ticks through a full window: once the stale minutes are gone, no HDEL runs at all."""
    tracker = LimitTracker(private, PREFIX)
    first = int(START_S // 60)
    for minute in range(WINDOW_MIN + 1):  # the whole window filled, nothing stale yet
        await _tick(tracker, START_S + minute * 60)
    before = await command_calls(private, "hdel")
    await _tick(tracker, START_S + WINDOW_MIN * 60 + 30)  # later in the same minute
    assert (
        await command_calls(private, "hdel") == before
    )  # 30 fields looked up in each org's stats before
    assert await _minutes(private, "org-0") == set(range(first, first + WINDOW_MIN + 1))


async def test_a_new_minute_deletes_the_one_that_left_the_window(private: Redis) -> None:
    """The first write of a minute deletes the minute that left the window, one HDEL an org."""
    tracker = LimitTracker(private, PREFIX)
    first = int(START_S // 60)
    for minute in range(WINDOW_MIN + 2):  # the last tick pushes the first minute out
        before = await command_calls(private, "hdel")
        await _tick(tracker, START_S + minute * 60)
        assert await command_calls(private, "hdel") - before == (
            ORGS if minute > WINDOW_MIN else 0
        ), minute
    for org in _orgs():
        assert await _minutes(private, org) == set(range(first + 1, first + WINDOW_MIN + 2))

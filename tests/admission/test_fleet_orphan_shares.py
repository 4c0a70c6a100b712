"""Shares left behind by a member of the previous release, which forgets orgs by their limit.

During a rolling update (or a rollback) a member of the previous release (47c84dd) may win a
tick and forget the orgs gone quiet: its ``thr_set_limits`` clears their ``T:limits`` entries
and removes them from the window, and knows nothing of ``T:shares``. Such a share no longer
counts, but nothing removed it: a flood of one-message tenants forgotten so left one entry
each in Redis for good. This release's tick drops them, a bounded step at a time. The
previous release's own library is loaded and called here, as its member would.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy
from pipeline.admission.shares import Share
from pipeline.admission.throttle import Throttle
from pipeline.redis_functions import FunctionLibrary

pytestmark = pytest.mark.redis

PREVIOUS = "47c84dd"
REPO = Path(__file__).resolve().parents[2]
ORGS = 1_200
"""Over two steps of the prune (500 fields a call), so the step's cursor is crossed."""


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys live under a prefix of their own."""
    async with started_throttle(redis_service, prefix=f"s{unique}", namespace="n") as limiter:
        yield limiter


@pytest.fixture(scope="module")
def previous_source() -> str:
    """The previous release's ``throttle.lua``, from the repository's history."""
    return subprocess.run(
        ["git", "show", f"{PREVIOUS}:pipeline/admission/lua/throttle.lua"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
async def previous(throttle: Throttle, previous_source: str) -> AsyncIterator[FunctionLibrary]:
    """The previous release's throttle library, loaded beside this one's (deleted after)."""
    library = FunctionLibrary(throttle.client, previous_source)
    yield library
    await throttle.client.function_delete(f"pipeline_throttle_{library.version}")


async def test_the_tick_drops_the_shares_of_orgs_the_previous_release_forgot(
    throttle: Throttle, previous: FunctionLibrary
) -> None:
    """1,200 orgs forgotten by the previous release, one still limited: its share alone stays.

    Before, all 1,201 shares stayed in ``T:shares`` however many ticks ran.
    """
    gone = [f"org:gone-{i:04}" for i in range(ORGS)]
    await throttle.set_shares({key: (2, Share(4, 2, 0)) for key in [*gone, "org:kept"]})
    meta = k.meta(throttle.prefix, "n")
    args: list[str | int] = [throttle.default_limit, "old-member"]
    for key in gone:
        args += [key, ""]
    await previous.fcall("thr_set_limits", [meta, k.slot_guard(throttle.prefix, "n")], args)
    shares = k.shares(throttle.prefix, "n")
    assert await throttle.client.hlen(shares) == ORGS + 1

    fleet = FleetLimits(
        throttle.client, throttle.prefix, throttle, LimitPolicy(), member="a", interval_s=10.0
    )
    fleet.bind(lambda: (0, 100))
    for tick in range(4):
        await fleet.tick(1_000_000.0 + tick * 10)

    assert await throttle.client.hkeys(shares) == [b"org:kept"]
    assert await throttle.client.hget(meta, "shares_at") is None

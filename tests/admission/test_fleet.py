"""Dynamic per-org limits applied by the fleet (``pipeline.admission.fleet``) on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.fleet import FleetLimits
from pipeline.admission.keys import fleet_load, org_config
from pipeline.admission.limits import LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

INTERVAL_S = 10.0
POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle whose keys and limit stats live under a prefix of their own."""
    t = Throttle(Redis.from_url(redis_service), prefix=f"f{unique}", namespace="n")
    await t.start()
    yield t
    await t.close()
    await t.client.aclose()


@contextmanager
def _host_clock_off_by(monkeypatch: pytest.MonkeyPatch, offset_s: float) -> Iterator[None]:
    """The host's wall clock reads ``offset_s`` off while the block runs (a member's host)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + offset_s)
    try:
        yield
    finally:
        monkeypatch.setattr(time, "time", real)


def _member(throttle: Throttle, name: str, running: int, slots: int) -> FleetLimits:
    fleet = FleetLimits(
        throttle.client, throttle.prefix, throttle, POLICY, member=name, interval_s=INTERVAL_S
    )
    fleet.bind(lambda: (running, slots))
    return fleet


async def test_one_member_recomputes_per_tick_from_every_members_reports(throttle) -> None:
    """Each tick every member reports and exactly one recomputes, for the orgs all have seen."""
    a, b = _member(throttle, "a", 10, 50), _member(throttle, "b", 10, 50)
    for _ in range(120):  # a steady org: 120 jobs of 1 s
        a.submitted("steady")
        a.finished("steady", 1.0)
    for _ in range(600):  # a flooding org, seen by the other member: 600 jobs of 3 s
        b.submitted("flood")
        b.finished("flood", 3.0)
    now = 1_000_000.0
    for tick in range(2):  # the first tick's winner may not have had the other's report yet
        results = [await a.tick(now + tick * INTERVAL_S), await b.tick(now + tick * INTERVAL_S)]
        assert sum(r is not None for r in results) == 1, "exactly one member recomputed"
    limits = next(r for r in results if r is not None)
    # R is averaged over the 5 2/3 minutes the stats window covers at second 40: flood
    # 106/min of 3 s -> base 6, ceiling 9; steady 21/min of 1 s -> base 2 (the floor), ceiling
    # 4. Fleet: 100 slots * 0.8 = 80 target, 20 in flight: factor 4, clamped to f_max 2.
    assert limits == {"flood": 18, "steady": 8}
    assert (await throttle.status("org:flood")).limit == 18
    assert (await throttle.status("org:steady")).limit == 8


async def test_a_full_pool_shrinks_every_ceiling_down_to_the_floors(throttle) -> None:
    """Over-committed (in flight far above the pool target): the factor falls to f_min."""
    busy = _member(throttle, "busy", 400, 100)  # 400 running for a target of 80
    for _ in range(600):
        busy.submitted("flood")
        busy.finished("flood", 3.0)
    busy.submitted("quiet")
    limits = await busy.tick(2_000_000.0)
    assert limits is not None
    assert limits["flood"] == 2  # floor(8 * 0.25) = 2, the floor
    assert limits["quiet"] == 2  # floor(4 * 0.25) = 1, held at the floor


async def test_an_org_with_floor_zero_held_at_zero_gets_a_slot_once_the_fleet_has_room(
    throttle,
) -> None:
    """An org with floor 0 and burst_floor 0 squeezed to 0 while its jobs wait gets room again."""
    policy = LimitPolicy(defaults=OrgLimits(floor=0, burst_floor=0, burst_pct=0.5), f_min=0.25)
    load = [(400, 100)]  # 400 running for a target of 80: factor f_min
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, policy, member="a")
    fleet.bind(lambda: load[0])
    for _ in range(6):  # 6 jobs of 1 s: base 1, ceiling 2, squeezed to floor(2 * 0.25) = 0
        fleet.submitted("small")
        fleet.finished("small", 1.0)
    now = 1_000_000.0
    assert await fleet.tick(now) == {"small": 0}
    for minute in range(1, 8):  # its jobs keep arriving and wait; its last finish leaves the window
        fleet.submitted("small")
        await fleet.tick(now + 60 * minute)
    load[0] = (0, 100)  # the fleet goes idle
    fleet.submitted("small")
    limits = await fleet.tick(now + 60 * 8)
    assert limits is not None
    # Demand with no job finished in the window: base 1, ceiling 2, factor f_max 2 -> 4.
    assert limits["small"] == 4
    permit = await throttle.try_acquire(["org:small"])
    assert permit is not None
    await throttle.release(permit)


async def test_members_that_stopped_reporting_leave_the_fleet(throttle) -> None:
    """A member silent for three intervals no longer counts towards slots or work in flight."""
    gone = _member(throttle, "gone", 0, 1000)
    await gone.tick(3_000_000.0)
    live = _member(throttle, "live", 90, 100)
    live.submitted("acme")
    limits = await live.tick(3_000_000.0 + 4 * INTERVAL_S)
    assert limits is not None
    # Without "gone": target 80, 90 in flight: factor 0.89; ceiling 4 -> 3.
    assert limits["acme"] == 3
    assert set(await throttle.client.hgetall(fleet_load(throttle.prefix))) == {b"live"}


async def test_an_org_that_went_quiet_leaves_no_limit_behind(throttle) -> None:
    """An org unseen for the whole stats window goes back to the default limit (no entry left)."""
    fleet = _member(throttle, "a", 1, 50)
    fleet.submitted("brief")
    fleet.finished("brief", 1.0)
    now = 1_000_000.0
    assert (await fleet.tick(now))["brief"] >= 2  # type: ignore[index]
    limits_key = f"{{{throttle.prefix}:thr:{throttle.namespace}}}:limits"
    assert await throttle.client.hexists(limits_key, "org:brief")
    later = now + 60 * 60  # an hour without a job from it
    assert "brief" not in (await fleet.tick(later) or {})
    assert not await throttle.client.hexists(limits_key, "org:brief")
    assert (await throttle.status("org:brief")).limit == throttle.default_limit


async def test_a_member_whose_clock_is_behind_still_counts_and_keeps_its_orgs_limits(
    throttle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members whose host clocks disagree (one 10 min behind) still share one fleet clock."""
    a, b = _member(throttle, "a", 10, 50), _member(throttle, "b", 10, 50)
    for _ in range(600):  # the flooding org is seen only by the member whose clock is behind
        b.submitted("flood")
        b.finished("flood", 3.0)
    with _host_clock_off_by(monkeypatch, -600.0):  # a VM resumed from suspend, not synced yet
        await b.tick()
    await a.tick()  # the same moment, on a host whose clock is right
    # Whoever recomputed: flood 600 in the 5-6 minutes the window covers, of 3 s -> base 6,
    # ceiling 9, factor f_max 2 -> 18. Judged by its own clock, "a" took b's report for a stale
    # one and flood for gone (the default limit).
    assert (await throttle.status("org:flood")).limit == 18
    assert set(await throttle.client.hgetall(fleet_load(throttle.prefix))) == {b"a", b"b"}


async def test_an_override_that_is_not_valid_skips_only_its_own_org(
    throttle, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed per-org override in Redis leaves that org on the policy; the tick goes on."""
    fleet = _member(throttle, "a", 1, 50)
    for org in ("acme", "typo"):
        fleet.submitted(org)
    await throttle.client.hset(org_config(throttle.prefix), "typo", '{"flor": 5}')
    await throttle.client.hset(org_config(throttle.prefix), "acme", '{"floor": 7}')
    with caplog.at_level(logging.WARNING, logger="pipeline.admission.limits"):
        limits = await fleet.tick(4_000_000.0)
    # Factor f_max 2: acme's floor 7 -> ceiling 11; typo on the policy's defaults -> ceiling 4.
    assert limits == {"acme": 22, "typo": 8}
    (line,) = [r.getMessage() for r in caplog.records if "typo" in r.getMessage()]
    assert "flor" in line
    assert org_config(throttle.prefix) in line


async def test_a_tick_that_raises_is_logged_and_the_next_tick_still_runs(
    throttle, caplog: pytest.LogCaptureFixture
) -> None:
    """A tick failing on an error not of Redis (here the member's own load, once) is logged."""
    fleet = FleetLimits(
        throttle.client, throttle.prefix, throttle, POLICY, member="a", interval_s=0.05
    )
    failures = [RuntimeError("a bug")]

    def load() -> tuple[int, int]:
        if failures:
            raise failures.pop()
        return (1, 50)

    fleet.bind(load)
    fleet.submitted("huge")
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="pipeline.admission.fleet"):
        task = asyncio.create_task(fleet.run(stop))
        try:
            await eventually(lambda: task.done() or bool(caplog.records), timeout_s=10.0)
            assert not task.done(), f"the fleet task ended: {task.exception()!r}"
            (record,) = caplog.records[:1]
            assert "dynamic limits" in record.getMessage()
            assert record.exc_info is not None  # the traceback, for a bug
            fleet.submitted("huge")
            await eventually(lambda: task.done() or fleet.recomputed > 0, timeout_s=10.0)
            assert not task.done(), f"the fleet task ended: {task.exception()!r}"
            assert fleet.last["huge"] >= POLICY.defaults.floor
        finally:
            stop.set()
            await asyncio.wait_for(task, 10.0)


@pytest.mark.parametrize("report", ["not json", "[]", '{"at_ms": "soon"}', '{"slots": 1}'])
async def test_an_unreadable_load_report_is_dropped_and_the_tick_goes_on(
    throttle, caplog: pytest.LogCaptureFixture, report: str
) -> None:
    """A member's load report that cannot be read is one warning, deleted; the tick still runs."""
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, POLICY, member="a")
    fleet.bind(lambda: (1, 50))
    fleet.submitted("huge")
    await throttle.client.hset(fleet_load(throttle.prefix), "other", report)
    with caplog.at_level(logging.WARNING, logger="pipeline.admission.fleet"):
        await fleet.tick()
    assert fleet.recomputed > 0
    assert fleet.last["huge"] >= POLICY.defaults.floor
    (line,) = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert "'other'" in line
    assert fleet_load(throttle.prefix) in line
    assert not await throttle.client.hexists(fleet_load(throttle.prefix), "other")

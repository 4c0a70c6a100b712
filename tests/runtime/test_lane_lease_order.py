"""The lane lease of a member that consumes several lanes, and of one that stalled.

Before, a waiting member took every free lane it wanted and held it while it waited for the
others: two groups that each took one of two lanes both wanted waited for each other for ever,
and a lane was kept from a group by a member that did not consume it. And a member renewed its
lease only on the reap tick: one that resumed after a stall longer than its lease (a frozen VM)
ran the messages it polled first, on a lane another group had taken meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.retry.keys import guard_keys
from pipeline.runtime.lane_lease import LaneLease, LaneTaken

LEASE = "pipeline.runtime.lane_lease"
LEASE_MS = 30_000
LOOK_S = 0.05


@pytest.fixture
async def lanes(redis: Redis, prefix: str, unique: str) -> AsyncIterator[tuple[str, str]]:
    """Two lane names whose lease keys are deleted after the test."""
    names = (f"a_{unique}", f"b_{unique}")
    yield names
    await redis.delete(*(guard_keys(prefix, name).group for name in names))


def _lease(redis: Redis, prefix: str, lanes: list[str], group: str) -> LaneLease:
    return LaneLease(redis, prefix, lanes, group, lease_ms=LEASE_MS, check_s=LOOK_S)


async def test_a_waiting_member_holds_no_lane_so_two_groups_never_wait_for_each_other(
    redis: Redis, prefix: str, lanes: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Group one wants a and b, b is group two's: one holds neither while it waits."""
    caplog.set_level(logging.WARNING, logger=LEASE)
    a, b = lanes
    key_a, key_b = (guard_keys(prefix, name).group for name in lanes)
    never = asyncio.Event()
    two_on_b = _lease(redis, prefix, [b], "two")
    assert await two_on_b.wait(never)
    one = _lease(redis, prefix, [a, b], "one")
    stop_one = asyncio.Event()
    waiting = asyncio.create_task(one.wait(stop_one))
    two_on_both = _lease(redis, prefix, [b, a], "two")
    try:
        await eventually(lambda: any(f"lane {b!r}" in r.getMessage() for r in caplog.records))
        assert await redis.exists(key_a) == 0  # not kept from group two while one waits
        # Another member of group two, on both lanes: it takes a at once; one goes on waiting.
        assert await asyncio.wait_for(two_on_both.wait(never), 30)
        assert await redis.hget(key_a, "group") == b"two"
        await two_on_b.leave()
        assert await redis.hget(key_b, "group") == b"two"  # the other member of two holds it
        assert not waiting.done()
    finally:
        stop_one.set()
        assert await asyncio.wait_for(waiting, 30) is False
        await two_on_both.leave()
        await two_on_b.leave()
    assert await redis.exists(key_a, key_b) == 0  # the group's last member freed both


async def test_two_members_of_two_groups_starting_together_end_with_one_group_on_both(
    redis: Redis, prefix: str, lanes: tuple[str, str]
) -> None:
    """Lanes taken in one order: whichever group takes the first lane gets both."""
    a, b = lanes
    stop = asyncio.Event()
    one = _lease(redis, prefix, [a, b], "one")
    two = _lease(redis, prefix, [b, a], "two")
    first = asyncio.create_task(one.wait(stop))
    second = asyncio.create_task(two.wait(stop))
    try:
        done, _ = await asyncio.wait([first, second], timeout=30, return_when="FIRST_COMPLETED")
        assert done, "each group waits for a lane the other holds"
        [winner] = done
        group = b"one" if winner is first else b"two"
        for name in lanes:
            assert await redis.hget(guard_keys(prefix, name).group, "group") == group
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(first, second), 30)
        await one.leave()
        await two.leave()


async def test_a_member_after_a_stall_renews_before_its_next_batch(
    redis: Redis, prefix: str, lanes: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """No call while its renewal is recent; half a lease later, the lane's new group stops it."""
    a, _ = lanes
    key = guard_keys(prefix, a).group
    now = [1000.0]
    lease = LaneLease(
        redis, prefix, [a], "one", lease_ms=LEASE_MS, check_s=LOOK_S, clock=lambda: now[0]
    )
    assert await lease.wait(asyncio.Event())
    async with redis.pipeline(transaction=True) as tx:  # its lease ran out; the other took it
        tx.delete(key)
        tx.hset(key, mapping={"group": "other", "at": 0, "lease": LEASE_MS, "m:x": 2**60})
        tx.pexpire(key, LEASE_MS)
        await tx.execute()
    now[0] += 2.0
    await lease.confirm()  # renewed 2 s ago (on its clock): no Redis call, so nothing seen
    assert not [r for r in caplog.records if r.levelno == logging.CRITICAL]
    now[0] += LEASE_MS / 2000  # the process stood still for half a lease
    with pytest.raises(LaneTaken, match=f"lane {a!r} is consumed by group 'other' now"):
        await lease.confirm()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert f"lane {a!r} is consumed by group 'other' now" in line
    assert await redis.hget(key, "group") == b"other"


async def test_a_lease_kept_by_other_members_ends_with_their_holds(
    redis: Redis, prefix: str, lanes: tuple[str, str]
) -> None:
    """The last live member leaves while a crashed one's hold still runs: it ends with that."""
    a, _ = lanes
    key = guard_keys(prefix, a).group
    crashed = LaneLease(redis, prefix, [a], "one", lease_ms=LEASE_MS, check_s=LOOK_S)
    assert await crashed.wait(asyncio.Event())  # then killed: it never leaves
    longer = LaneLease(redis, prefix, [a], "one", lease_ms=20 * LEASE_MS, check_s=LOOK_S)
    assert await longer.wait(asyncio.Event())
    assert await redis.pttl(key) > LEASE_MS
    await longer.leave()
    assert await redis.hget(key, "group") == b"one"  # the crashed member's hold is still on
    assert 0 < await redis.pttl(key) <= LEASE_MS  # not the leaving member's 10 minutes


async def test_a_member_restarted_under_its_name_takes_its_old_hold_over(
    redis: Redis, prefix: str, lanes: tuple[str, str]
) -> None:
    """Killed, restarted as the same ``--instance``: its graceful stop frees the lane at once."""
    a, _ = lanes
    key = guard_keys(prefix, a).group
    killed = LaneLease(redis, prefix, [a], "one", lease_ms=LEASE_MS, member="consumer-0")
    assert await killed.wait(asyncio.Event())  # then SIGKILL: it never leaves
    restarted = LaneLease(redis, prefix, [a], "one", lease_ms=LEASE_MS, member="consumer-0")
    assert await restarted.wait(asyncio.Event())
    await restarted.leave()
    assert await redis.exists(key) == 0  # not held for the killed process's lease

"""The throttle's guarantees on a real Redis, with several Throttle members in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.order import canonical_order
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

Factory = Callable[..., Throttle]


@pytest.fixture
async def make(redis_service: str, unique: str) -> AsyncIterator[Factory]:
    """Build started throttles on one uuid-named namespace; close them all at the end."""
    made: list[Throttle] = []
    clients: list[Redis] = []

    async def build(**kw: object) -> Throttle:
        client = Redis.from_url(redis_service)
        clients.append(client)
        options: dict[str, object] = {"namespace": f"t{unique}", "default_limit": 2}
        options.update(kw)
        throttle = Throttle(client, **options)  # type: ignore[arg-type]
        await throttle.start()
        made.append(throttle)
        return throttle

    yield build  # type: ignore[misc]
    for throttle in made:
        await throttle.close()
    for client in clients:
        await client.aclose()


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Wait until the async ``predicate()`` holds (re-checked every 20 ms)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_grants_up_to_the_limit_then_queues(make):
    """Acquisitions beyond the limit wait, and a release hands the slot straight to a waiter."""
    t = await make()
    a = await t.acquire(["org:a"])
    b = await t.acquire(["org:a"])
    waiting = asyncio.create_task(t.acquire(["org:a"]))
    await eventually(lambda: t.waited == 1, 10)
    status = await t.status("org:a")
    assert status.limit == 2
    assert len(status.holders) == 2
    assert status.waiters_by_priority() == {0: 1}
    assert not waiting.done()
    await t.release(a)
    c = await asyncio.wait_for(waiting, 10)
    status = await t.status("org:a")
    assert {h for h, _ in status.holders} == {b.holder, c.holder}
    assert status.waiters == ()
    assert t.wakes == 1


async def test_fifo_within_priority_and_priority_order(make):
    """Waiters are served highest priority first and in arrival order within a priority."""
    t = await make(default_limit=1)
    first = await t.acquire(["k"])
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        permit = await t.acquire(["k"], priority=priority)
        order.append(name)
        await t.release(permit)

    plan = [("low1", 1), ("high1", 9), ("low2", 1), ("high2", 9), ("mid", 5)]
    tasks = []
    for i, (name, priority) in enumerate(plan, start=1):
        tasks.append(asyncio.create_task(wait(name, priority)))
        await eventually(lambda i=i: t.waited == i, 10)
    await t.release(first)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


async def test_no_barging_when_limit_rises(make):
    """A newcomer queues behind existing waiters even when a raised limit leaves room for both."""
    t = await make(default_limit=1)
    held = await t.acquire(["k"])
    waiter = asyncio.create_task(t.acquire(["k"]))
    await eventually(lambda: t.waited == 1, 10)
    assert await t.try_acquire(["k"]) is None  # a slot is owed to the waiter
    await t.set_limit("k", 2)
    granted = await asyncio.wait_for(waiter, 10)
    assert await t.try_acquire(["k"]) is None  # full again: 2 holders
    for permit in (held, granted):
        await t.release(permit)
    assert await t.try_acquire(["k"]) is not None


async def test_multi_key_keeps_granted_prefix(make):
    """A job holds the keys it got in sorted order and waits on the first full one."""
    t = await make(default_limit=1)
    blocker = await t.acquire(["b"])
    job = asyncio.create_task(t.acquire(["c", "a", "b"]))
    await eventually(lambda: t.waited == 1, 10)
    assert [h for h, _ in (await t.status("a")).holders] != []
    assert (await t.status("b")).waiters != ()
    assert (await t.status("c")).holders == ()
    await t.release(blocker)
    permit = await asyncio.wait_for(job, 10)
    assert permit.keys == ("a", "b", "c")
    for key in permit.keys:
        assert [h for h, _ in (await t.status(key)).holders] == [permit.holder]


async def test_overlapping_multi_key_jobs_all_complete(make):
    """Many jobs over overlapping key sets on three members finish without deadlock."""
    members = [await make(default_limit=2) for _ in range(3)]
    keys = ["org:a", "org:b", "sub:a/1", "sub:b/1", "doc:1", "doc:2"]
    done = 0
    max_seen: dict[str, int] = {}
    holding: dict[str, int] = dict.fromkeys(keys, 0)

    async def job(i: int) -> None:
        nonlocal done
        t = members[i % 3]
        mine = [keys[i % 6], keys[(i * 7 + 1) % 6], keys[(i * 5 + 3) % 6]]
        async with t.hold(mine, priority=i % 3) as permit:
            for key in permit.keys:
                holding[key] += 1
                max_seen[key] = max(max_seen.get(key, 0), holding[key])
            await asyncio.sleep(0.001 * (i % 4))  # work, not synchronisation
            for key in permit.keys:
                holding[key] -= 1
        done += 1

    await asyncio.wait_for(asyncio.gather(*(job(i) for i in range(200))), 60)
    assert done == 200
    assert max(max_seen.values()) <= 2
    for key in keys:
        status = await members[0].status(key)
        assert status.holders == ()
        assert status.waiters == ()


async def test_roundtrips_one_acquire_one_release(make):
    """An uncontended acquisition and its release cost exactly two Redis round trips."""
    t = await make()
    before = t.roundtrips
    permit = await t.acquire(["org:x", "sub:x/1", "job:1"])
    await t.release(permit)
    assert t.roundtrips - before == 2


async def test_dead_member_slot_passes_on_after_lease(make):
    """A member that stops renewing loses its slot after the lease; a waiter then gets it."""
    dead = await make(default_limit=1, lease_ms=300)
    alive = await make(default_limit=1, lease_ms=300)
    await dead.acquire(["k"])
    dead._closed.set()  # stop renewing, as a killed process would
    assert dead._renewer is not None
    await dead._renewer
    # Expiry is lazy: the waiter's own heartbeat call finds the lapsed lease and takes the slot.
    permit = await asyncio.wait_for(alive.acquire(["k"]), 10)
    assert permit.holder in {h for h, _ in (await alive.status("k")).holders}


async def test_waiters_of_a_dead_member_leave_the_queue(make):
    """Waiting permits whose member stopped renewing are dropped, not handed a slot."""
    owner = await make(default_limit=1, lease_ms=300)
    dead = await make(default_limit=1, lease_ms=300)
    held = await owner.acquire(["k"])
    ghost = asyncio.create_task(dead.acquire(["k"]))
    await eventually(lambda: dead.waited == 1, 10)
    dead._closed.set()
    assert dead._renewer is not None
    await dead._renewer

    async def ghost_gone() -> bool:  # the owner's heartbeats expire the ghost lazily
        return (await owner.status("k")).waiters == ()

    await until(ghost_gone)
    await owner.release(held)
    assert (await owner.status("k")).holders == ()
    ghost.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ghost


async def test_cancelled_waiter_leaves_the_queue(make):
    """Cancelling a waiting acquire withdraws it, so the slot goes to the next waiter."""
    t = await make(default_limit=1)
    held = await t.acquire(["k"])
    doomed = asyncio.create_task(t.acquire(["k"]))
    await eventually(lambda: t.waited == 1, 10)
    nxt = asyncio.create_task(t.acquire(["k"]))
    await eventually(lambda: t.waited == 2, 10)
    doomed.cancel()
    await eventually(lambda: len(t._waiting) == 1, 10)
    await eventually(lambda: t.roundtrips >= 4, 10)
    await t.release(held)
    permit = await asyncio.wait_for(nxt, 10)
    assert [h for h, _ in (await t.status("k")).holders] == [permit.holder]


async def test_fails_open_when_redis_is_unreachable(unique):
    """With Redis down, acquire returns an unconditional permit and counts it."""
    client = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    t = Throttle(client, namespace=f"t{unique}", wake_block_s=0.2)
    await t.start()
    permit = await t.acquire(["org:a"])
    assert permit.unconditional
    assert t.fail_open == 1
    await t.release(permit)
    await t.close()
    await client.aclose()


async def test_status_reports_recent_grants(make):
    """The status lists recent grants newest first and a set limit."""
    t = await make()
    await t.set_limit("org:s", 5)
    permits = [await t.acquire(["org:s"]) for _ in range(3)]
    status = await t.status("org:s")
    assert status.limit == 5
    assert [h for h, _ in status.recent_grants] == [p.holder for p in reversed(permits)]
    assert "org:s" in await t.active_keys()


def test_canonical_order_is_narrowest_scope_first():
    """Keys are taken job, sub-tenant, org, dependency, pool, without duplicates."""
    keys = ["pool", "org:acme", "dep:vision", "sub:acme/t1", "job:doc-1", "org:acme", "zz:x"]
    assert canonical_order(keys) == (
        "job:doc-1",
        "sub:acme/t1",
        "org:acme",
        "zz:x",
        "dep:vision",
        "pool",
    )


async def test_wake_delay_is_recorded(make):
    """A hand-over records how long its wake took to arrive."""
    t = await make(default_limit=1)
    held = await t.acquire(["k"])
    waiting = asyncio.create_task(t.acquire(["k"]))
    await eventually(lambda: t.waited == 1, 10)
    await t.release(held)
    await t.release(await asyncio.wait_for(waiting, 10))
    assert len(t.wake_delays_ms) == 1


async def test_handover_to_another_member_goes_through_its_wake_list(make):
    """A slot released by one member reaches a waiter of another through the wake list."""
    a = await make(default_limit=1)
    b = await make(default_limit=1)
    held = await a.acquire(["k"])
    waiting = asyncio.create_task(b.acquire(["k"]))
    await eventually(lambda: b.waited == 1, 10)
    await a.release(held)
    await b.release(await asyncio.wait_for(waiting, 10))
    assert b._wake.wakes == 1
    assert a.wakes == 0


async def test_a_cancellation_absorbed_below_the_acquire_call_still_cancels_it(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its call is in flight, an acquisition ends cancelled and leaves the queue.

    redis-py writes each command under ``asyncio.wait_for``, which on Python 3.11 returns the
    write's result instead of raising when the cancellation arrives as the write completes
    (CPython issue 86296). The acquisition then went on to wait for its grant forever (seen in
    the fairness benchmark: a phase that never ended). The stand-in for that race makes the real
    call, then has the cancellation requested and absorbed below the caller.
    """
    t = await make(default_limit=1)
    held = await t.acquire(["k"])
    real = t._functions._call
    absorbed: list[bool] = []

    async def absorbing(loaded: str, keys: list[str], args: list[object]) -> object:
        reply = await real(loaded, keys, args)
        if not absorbed:
            absorbed.append(True)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # requested while the call is in flight...
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)  # ...and absorbed on the way back, as that wait_for does
        return reply

    monkeypatch.setattr(t._functions, "_call", absorbing)
    acquiring = asyncio.create_task(t.acquire(["k"]))
    done, _ = await asyncio.wait({acquiring}, timeout=10)
    assert done, "the cancelled acquisition still waits for its grant"
    assert acquiring.cancelled()
    await until(lambda: _no_waiters(t, "k"))
    await t.release(held)


async def _no_waiters(t: Throttle, key: str) -> bool:
    return not (await t.status(key)).waiters


async def test_an_acquisition_whose_reply_was_lost_leaves_no_slot_held(make, monkeypatch):
    """The acquire ran in Redis but its reply was lost: its slot is given back, not orphaned.

    The job runs failed open, and the permit the call made in Redis is withdrawn once Redis
    answers. Before, that permit held the slot until its lease (60 s by default) ran out:
    after a Redis stall the tenant's limit stayed taken by permits nobody held or renewed.
    """
    t = await make(default_limit=1)
    real = t._call
    calls = 0

    async def reply_lost(call: Awaitable[object]) -> object:
        nonlocal calls
        calls += 1
        result = await real(call)
        if calls == 1:  # the acquire: Redis ran it, the answer never came
            raise TimeoutError("Timeout reading from socket")
        return result

    monkeypatch.setattr(t, "_call", reply_lost)
    permit = await t.acquire(["org:lost"])
    assert permit.unconditional  # failed open
    await asyncio.gather(*t._background)  # the withdrawal, once Redis answers
    assert (await t.status("org:lost")).holders == ()
    granted = await asyncio.wait_for(t.acquire(["org:lost"]), 10)  # the slot is free again
    assert not granted.unconditional
    await t.release(granted)


async def test_a_key_with_a_lone_surrogate_is_throttled_like_any_other(make):
    """A key holding a lone surrogate (from a JSON field of a template) is held to its limit."""
    t = await make(default_limit=1)
    key = "sub:acme/\ud800"
    held = await t.acquire(["org:acme", key])
    assert t.fail_open == 0
    assert await t.try_acquire([key]) is None  # the one slot is taken: no barging past it
    assert (await t.status(key)).holders[0][0] == held.holder
    await t.release(held)
    assert (await t.status(key)).holders == ()

"""Claimed ranges through an outage of every member longer than the retry path.

A first delivery under its member's claim runs with no start mark (``runtime/claims.py``): what
tells the partition's next owner that it may have been running is the claim itself, which a
crashed member never gives up. These tests take the fleet down past the retry path plus an
hour (the guard's short bound) with such a claim left behind, and bring it back with a new
member process:

* a message that kills its member under the claim, the fleet down past the bound after each
  crash: its crashes count towards ``poison_after`` as they do without the outages;
* a first delivery that failed under the claim and whose retry copy was produced, its member
  killed before committing its offset: read again, it is stale, and the message runs once.

Time is moved on in Redis (``retry/test_marks_outage.py``'s ``outage``). The members are run
guards built as in ``runtime/test_claims.py``.
"""

from __future__ import annotations

import asyncio
import contextlib

from redis.asyncio import Redis
from retry.test_marks_outage import outage
from runtime.guard_parts import (
    Handlers,
    guarded_lane,
    main_message,
    member_guard,
    retry_copy,
    routing_guard,
)
from runtime.helpers import join, lane_spec

from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard


async def _crash(guard: RunGuard, lane: Lane, redis: Redis, task: asyncio.Task[object]) -> None:
    """The member dies while ``task`` runs, its claim left behind; the fleet goes down with it."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    store = guard._stores[lane.name]
    await redis.hdel(store.keys.live, store.instance)
    await outage(redis, store)


async def test_a_crash_under_a_claim_before_an_outage_counts_towards_poison_after(
    redis: Redis, unique: str
) -> None:
    """A message that kills its member, the fleet down past the bound after each crash: poison.

    Each outage ends with a new member process, which reads the message again (its offset was
    never committed). As without the outages, the first crash, under the claim, is not
    counted, and the message is dead-lettered as poison after ``poison_after`` + 1 crashes.
    """
    lane = guarded_lane(f"claims_{unique}")
    poison_after = lane.spec.retry.poison_after
    handlers = Handlers()
    poison = main_message(lane, 3, b"poison")
    handlers.hold[b"poison"] = asyncio.Event()  # never set: every run of it dies in the handler
    crashes = 0
    for member in range(poison_after + 4):
        guard = member_guard(redis, f"t{unique}", lane, handlers, f"m{member}", claims=True)
        await join(guard, lane, [poison])
        started = handlers.started[b"poison"] = asyncio.Event()
        run = asyncio.create_task(guard.run(lane, poison))
        entered = asyncio.create_task(started.wait())
        await asyncio.wait({run, entered}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        entered.cancel()
        if run.done():
            outcome = run.result()
            break
        assert started.is_set(), "neither ran nor decided within 10 s"
        if member == 0:
            assert guard.calls == 0  # it ran under the claim, unmarked
        crashes += 1
        await _crash(guard, lane, redis, run)
    else:
        raise AssertionError(f"still not poison after {crashes} crashes: it would crash for ever")
    assert outcome == "dead_lettered"
    assert crashes == poison_after + 1


def _plain_lane(name: str) -> Lane:
    """A lane without ordered retries, tiers ``1s, 5s``, one partition (handler stood in for)."""
    app = App([lane_spec(name, 1, ordered=False, retry={"tiers": ["1s", "5s"]})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        raise AssertionError("the handler stage is replaced in these tests")

    return app.lanes[name]


async def test_a_failed_claimed_delivery_read_again_after_an_outage_does_not_run_again(
    redis: Redis, unique: str
) -> None:
    """It failed under the claim and its retry copy was produced: after the outage it is stale.

    Its member recorded the route and its end, and was killed before it committed the
    delivery's offset; the next owner reads the delivery again before the copy.
    """
    lane = _plain_lane(f"plain_{unique}")
    a, failed_runs = routing_guard(redis, f"t{unique}", lane, b"v", claims=True)
    delivery = main_message(lane, 3, b"v")
    await join(a, lane, [delivery])
    assert await a.run(lane, delivery) is not None  # failed, its copy produced (attempt 2)
    assert failed_runs == [b"v"]
    assert a.calls == 0  # it ran under the claim, unmarked
    await a.flush()  # its end goes before the commit; the member dies before committing
    store = a._stores[lane.name]
    await redis.hdel(store.keys.live, store.instance)
    await outage(redis, store)

    handlers = Handlers()
    b = member_guard(redis, f"t{unique}", lane, handlers, "b", claims=True)
    await join(b, lane, [delivery])
    again = await b.run(lane, delivery)
    copy = retry_copy(lane, 3, 0, b"v")
    assert await b.run(lane, copy) == "handled"
    assert [value for _, value, _, _ in handlers.runs] == [b"v"], (
        "the message ran twice: its failed delivery ran again after the outage"
    )
    assert again == "duplicate"

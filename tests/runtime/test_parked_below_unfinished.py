"""Where a key is parked from never passes an earlier message of the key left unfinished.

A key parked by a first delivery keeps where it was parked from: a delivery of the key read
again from that partition below it is stale (``tests/retry/test_parked_stale_below.py``). An
earlier message of the key whose run here left it unfinished (unrouted: its failure could not be
produced; or its run raised) is read again after a crash and must run then: the key is parked
from its offset instead, so that it is held behind the head as before, never dropped.

A real run guard on a real Redis; the broker is stood in for (``guard_parts``).
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.guard_parts import Producer, guarded_lane, main_message

from pipeline.envelope import Message, Position
from pipeline.retry.guard_store import lane_guards, start_of
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats


def guard(redis: Redis, prefix: str, lane: Lane, outcomes: dict[bytes, str | None]) -> RunGuard:
    """A member's guard: ``m2`` fails, routed for real (its key parks); ``raises`` raises.

    Values in ``outcomes`` end so (None: unrouted); others are handled.
    """
    stats = Stats()
    routing = Redirector(RetryRouter(Producer()), stats, default_retryable, [lane])  # type: ignore[arg-type]

    async def stage(lane_: Lane, message: Message) -> str | None:
        if message.value == b"m2":
            return await routing.failure(lane_, message, 1, RuntimeError("flaky"))
        if message.value == b"raises":
            raise RuntimeError("a bug before the message was routed")
        return outcomes.get(message.value, "handled")

    stores = lane_guards(redis, prefix, [lane.spec])
    return RunGuard(stores, routing, stats, Isolation(5.0), stage, lambda *_: None)


async def parked_from(redis: Redis, prefix: str, lane: Lane) -> bytes | None:
    """Where key ``k`` was parked from (its state's ``below``)."""
    store = lane_guards(redis, prefix, [lane.spec])[lane.name]
    _, state, _ = store.keys.of_key(start_of(main_message(lane, 0, b""), ordered=True).key)
    value: bytes | None = await redis.hget(state, "below")
    return value


async def test_a_key_parked_after_its_earlier_messages_finished_is_parked_from_the_head(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Every earlier message of the key finished here: parked from the head's own offset."""
    lane = guarded_lane(f"below_{unique}")
    run = guard(redis, prefix, lane, {})
    assert await run.run(lane, main_message(lane, 10, b"m1")) == "handled"
    assert await run.run(lane, main_message(lane, 11, b"m2")) == "retried"
    assert await parked_from(redis, prefix, lane) == f"{lane.spec.name}:0:11".encode()


async def test_an_unrouted_earlier_message_is_where_the_key_is_parked_from(
    redis: Redis, unique: str, prefix: str
) -> None:
    """M1 left unrouted: the key is parked from M1, which is held (not dropped) when read again."""
    lane = guarded_lane(f"below_{unique}")
    run = guard(redis, prefix, lane, {b"m1": None})
    assert await run.run(lane, main_message(lane, 10, b"m1")) is None
    assert await run.run(lane, main_message(lane, 11, b"m2")) == "retried"
    assert await parked_from(redis, prefix, lane) == f"{lane.spec.name}:0:10".encode()
    again = guard(redis, prefix, lane, {})  # the next member, after a crash
    assert await again.run(lane, main_message(lane, 10, b"m1")) == "parked"  # held, not dropped


async def test_a_run_that_raised_is_where_the_key_is_parked_from(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A run that raised left its message unfinished, as an unrouted one."""
    lane = guarded_lane(f"below_{unique}")
    run = guard(redis, prefix, lane, {})
    try:
        await run.run(lane, main_message(lane, 9, b"raises"))
    except RuntimeError:
        pass
    else:
        raise AssertionError("the run did not raise")
    assert await run.run(lane, main_message(lane, 11, b"m2")) == "retried"
    assert await parked_from(redis, prefix, lane) == f"{lane.spec.name}:0:9".encode()


async def test_an_unfinished_message_committed_past_is_forgotten(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Its partition back here committed past it: it counts no more."""
    lane = guarded_lane(f"below_{unique}")
    run = guard(redis, prefix, lane, {b"m1": None})
    first = main_message(lane, 10, b"m1")
    assert await run.run(lane, first) is None
    await run.assigned([first.tp], {first.tp: Position(first.tp, 11)})  # committed past it
    assert await run.run(lane, main_message(lane, 11, b"m2")) == "retried"
    assert await parked_from(redis, prefix, lane) == f"{lane.spec.name}:0:11".encode()


async def test_an_unfinished_message_read_again_and_finished_here_is_forgotten(
    redis: Redis, unique: str, prefix: str
) -> None:
    """M1 unrouted, then read again here (the partition back) and handled: M2 parks from itself."""
    lane = guarded_lane(f"below_{unique}")
    outcomes: dict[bytes, str | None] = {b"m1": None}
    run = guard(redis, prefix, lane, outcomes)
    assert await run.run(lane, main_message(lane, 10, b"m1")) is None
    del outcomes[b"m1"]
    assert await run.run(lane, main_message(lane, 10, b"m1")) == "handled"
    assert await run.run(lane, main_message(lane, 11, b"m2")) == "retried"
    assert await parked_from(redis, prefix, lane) == f"{lane.spec.name}:0:11".encode()
